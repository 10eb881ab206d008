//! `DiskLog`: the raft log of a head with `--data-dir`, on disk in segments and snapshot files.
//!
//! Three locks, always taken in this order, none held longer than its step:
//! - `files`: the active segment and what is on disk; held across a write and its fsync, so
//!   writes reach the file in order;
//! - `pending`: the records queued since the last sync; `append` and `set_*_state` encode into
//!   it, and `sync` swaps it out before writing, so appends go on while an fsync is under way
//!   (group commit: whatever accumulated during one fsync goes out with the next);
//! - `core`: the in-memory log that reads are served from; held only to update or copy plain
//!   data, never across I/O.
//!
//! `compact` and `apply_snapshot` hold `pending` for their whole duration, so no append
//! interleaves with them. After any failed write or fsync the log refuses every further write
//! (`LogError::Failed`): the kernel may have dropped the dirty pages, so what is on disk is
//! unknown until recovery reads it again.

use std::fmt;
use std::fs::File;
use std::mem;
use std::path::{Path, PathBuf};
use std::sync::{
    Arc, Mutex, MutexGuard, OnceLock, PoisonError, RwLock, RwLockReadGuard, RwLockWriteGuard,
};

use nix::fcntl::Flock;
use raft::eraftpb::{ConfState, Entry, HardState, Snapshot};

use super::files::{remove_stale, sync_dir};
use super::format::{self, SnapshotRecord};
use super::log_core::LogCore;
use super::recover::{self, LostTail, SegmentMeta};
use super::segment::{self, ActiveSegment};
use super::{LogError, LogIdentity, LogStore, snapshot_file};

/// Tunables of a [`DiskLog`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DiskLogOptions {
    /// A segment past this many bytes is closed and a new one started at the next sync.
    /// Compaction deletes whole segments, so smaller segments free disk sooner.
    pub segment_bytes: u64,
}

impl Default for DiskLogOptions {
    fn default() -> Self {
        DiskLogOptions {
            segment_bytes: 32 << 20,
        }
    }
}

/// The on-disk log: a cheap-to-clone handle; the directory stays locked until the last clone
/// is dropped.
#[derive(Clone)]
pub struct DiskLog {
    inner: Arc<Inner>,
}

struct Inner {
    dir: PathBuf,
    options: DiskLogOptions,
    files: Mutex<Files>,
    pending: Mutex<Pending>,
    core: RwLock<LogCore>,
    /// Why the log stopped taking writes.
    failure: OnceLock<String>,
    /// The last write, damaged after it was written whole and cut off at open.
    lost_tail: Option<LostTail>,
    _lock: Flock<File>,
}

/// What is on disk.
#[derive(Debug)]
struct Files {
    active: ActiveSegment,
    /// Oldest first; the last one is `active`.
    segments: Vec<SegmentMeta>,
    /// The hard and conf states as of the end of the active segment.
    hard_state: HardState,
    conf_state: ConfState,
    /// The index of the snapshot file, if there is one.
    snapshot_index: Option<u64>,
    /// An emptied buffer, handed back to `Pending` so its capacity is reused.
    spare: Vec<u8>,
}

/// The records queued since the last sync.
#[derive(Debug, Default)]
struct Pending {
    buf: Vec<u8>,
    /// The highest entry index in `buf` (0: none).
    max_index: u64,
    /// The hard and conf states as of the end of `buf`.
    hard_state: HardState,
    conf_state: ConfState,
}

/// Records taken from `Pending` to be written.
struct Batch {
    buf: Vec<u8>,
    max_index: u64,
    hard_state: HardState,
    conf_state: ConfState,
}

impl Pending {
    fn take(&mut self, spare: Vec<u8>) -> Batch {
        Batch {
            buf: mem::replace(&mut self.buf, spare),
            max_index: mem::take(&mut self.max_index),
            hard_state: self.hard_state.clone(),
            conf_state: self.conf_state.clone(),
        }
    }
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    // A panic cannot leave these half-changed (they change only after the checks and I/O that
    // can fail), so a poisoned lock is still consistent.
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

impl DiskLog {
    /// Opens or creates the log in `dir` with the default options. A new directory records
    /// `identity`; an existing one must match it (else `LogError::WrongGroup` or
    /// `LogError::WrongReplica`). Every record's checksum is verified: a torn write at the very
    /// end of the newest segment is cut off (and logged with how many bytes were dropped);
    /// damage anywhere else is `LogError::Corrupt`, naming the file and offset.
    pub fn open(dir: &Path, identity: &LogIdentity) -> Result<DiskLog, LogError> {
        DiskLog::open_with(dir, identity, DiskLogOptions::default())
    }

    /// [`DiskLog::open`] with explicit options.
    pub fn open_with(
        dir: &Path,
        identity: &LogIdentity,
        options: DiskLogOptions,
    ) -> Result<DiskLog, LogError> {
        let r = recover::recover(dir, identity)?;
        tracing::info!(
            dir = %dir.display(),
            group = %identity.group,
            replica = identity.replica,
            snapshot_index = r.core.snapshot_index(),
            first_index = r.core.first_index(),
            last_index = r.core.last_index(),
            commit = r.core.hard_state().commit,
            segments = r.segments.len(),
            "raft log opened"
        );
        let pending = Pending {
            hard_state: r.core.hard_state().clone(),
            conf_state: r.core.conf_state().clone(),
            ..Pending::default()
        };
        let files = Files {
            active: r.active,
            segments: r.segments,
            hard_state: pending.hard_state.clone(),
            conf_state: pending.conf_state.clone(),
            snapshot_index: r.snapshot_index,
            spare: Vec::new(),
        };
        Ok(DiskLog {
            inner: Arc::new(Inner {
                dir: dir.to_path_buf(),
                options,
                files: Mutex::new(files),
                pending: Mutex::new(pending),
                core: RwLock::new(r.core),
                failure: OnceLock::new(),
                lost_tail: r.lost_tail,
                _lock: r.lock,
            }),
        })
    }

    /// The directory the log lives in.
    pub fn dir(&self) -> &Path {
        &self.inner.dir
    }

    fn read(&self) -> RwLockReadGuard<'_, LogCore> {
        self.inner
            .core
            .read()
            .unwrap_or_else(PoisonError::into_inner)
    }

    fn write(&self) -> RwLockWriteGuard<'_, LogCore> {
        self.inner
            .core
            .write()
            .unwrap_or_else(PoisonError::into_inner)
    }

    fn check_failed(&self) -> Result<(), LogError> {
        match self.inner.failure.get() {
            Some(cause) => Err(LogError::Failed {
                cause: cause.clone(),
            }),
            None => Ok(()),
        }
    }

    /// Stops the log taking writes because of `e`, and returns `e`.
    fn fail(&self, e: LogError) -> LogError {
        tracing::error!(dir = %self.inner.dir.display(), error = %e, "raft log write failed; it takes no more writes");
        let _ = self.inner.failure.set(e.to_string());
        e
    }

    /// The queue of records to write, once it is known the log still takes writes.
    fn pending(&self) -> Result<MutexGuard<'_, Pending>, LogError> {
        self.check_failed()?;
        Ok(lock(&self.inner.pending))
    }

    /// Writes `batch` at the end of the active segment with a sync marker, fsyncs it, and starts
    /// a new segment if the active one is full.
    fn write_batch(&self, files: &mut Files, mut batch: Batch) -> Result<(), LogError> {
        if batch.buf.is_empty() {
            files.spare = batch.buf;
            return Ok(());
        }
        let records = batch.buf.len();
        format::push_sync(&mut batch.buf)?;
        if let Err(e) = files.active.write(&batch.buf) {
            if !(matches!(
                &e,
                LogError::Io {
                    action: "write",
                    ..
                }
            ) && e.for_want_of_space())
            {
                return Err(self.fail(e));
            }
            // Nothing of this write counts: the bytes that made it are cut off, and the batch
            // goes back in front of what was queued since, to be written when space returns.
            // (An error of fsync itself is never retried: the kernel may have dropped the
            // pages it could not write.)
            files.active.truncate_to_len().map_err(|t| self.fail(t))?;
            batch.buf.truncate(records);
            let mut pending = lock(&self.inner.pending);
            batch.buf.append(&mut pending.buf);
            pending.buf = batch.buf;
            pending.max_index = pending.max_index.max(batch.max_index);
            // Logged once by the replica as it stalls; every retry would repeat it.
            tracing::debug!(dir = %self.inner.dir.display(), error = %e, "the raft log's disk is full: the write is kept and tried again");
            return Err(LogError::NoSpace {
                dir: self.inner.dir.clone(),
                cause: e.to_string(),
            });
        }
        let active = files
            .segments
            .last_mut()
            .expect("the active segment is listed");
        active.max_index = active.max_index.max(batch.max_index);
        files.hard_state = batch.hard_state;
        files.conf_state = batch.conf_state;
        batch.buf.clear();
        files.spare = batch.buf;
        if files.active.len() >= self.inner.options.segment_bytes {
            let seq = files.active.seq() + 1;
            let checkpoint = format::checkpoint(&files.hard_state, &files.conf_state)?;
            files.active = ActiveSegment::create(&self.inner.dir, seq, &checkpoint)
                .map_err(|e| self.fail(e))?;
            files.segments.push(SegmentMeta { seq, max_index: 0 });
        }
        Ok(())
    }

    /// Removes the segments before `keep` (an index into `files.segments`) and the snapshot file
    /// unless it is the one at `snapshot_index`, then records `snapshot_index` as current.
    fn drop_old_files(&self, files: &mut Files, keep: usize, snapshot_index: u64) {
        for old in files.segments.drain(..keep) {
            remove_stale(&self.inner.dir.join(segment::file_name(old.seq)));
        }
        if let Some(old) = files.snapshot_index.filter(|&i| i != snapshot_index) {
            remove_stale(&self.inner.dir.join(snapshot_file::file_name(old)));
        }
        files.snapshot_index = Some(snapshot_index);
        if let Err(e) = sync_dir(&self.inner.dir) {
            tracing::warn!(error = %e, "cannot make the removal of old raft log files durable");
        }
    }
}

impl fmt::Debug for DiskLog {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let core = self.read();
        f.debug_struct("DiskLog")
            .field("dir", &self.inner.dir)
            .field("first_index", &core.first_index())
            .field("last_index", &core.last_index())
            .field("hard_state", core.hard_state())
            .finish()
    }
}

super::log_core::storage_from_core!(DiskLog);

impl LogStore for DiskLog {
    fn lost_tail(&self) -> Option<LostTail> {
        self.inner.lost_tail.clone()
    }

    fn append(&self, entries: &[Entry]) -> Result<(), LogError> {
        let Some(last) = entries.last() else {
            return Ok(());
        };
        let mut pending = self.pending()?;
        self.read().check_append(entries)?;
        format::push_entries(&mut pending.buf, entries)?;
        pending.max_index = pending.max_index.max(last.index);
        self.write().append(entries);
        Ok(())
    }

    fn set_hard_state(&self, hs: HardState) -> Result<(), LogError> {
        let mut pending = self.pending()?;
        format::push_hard_state(&mut pending.buf, &hs)?;
        pending.hard_state = hs.clone();
        self.write().set_hard_state(hs);
        Ok(())
    }

    fn set_conf_state(&self, cs: ConfState) -> Result<(), LogError> {
        let mut pending = self.pending()?;
        format::push_conf_state(&mut pending.buf, &cs)?;
        pending.conf_state = cs.clone();
        self.write().set_conf_state(cs);
        Ok(())
    }

    fn sync(&self) -> Result<(), LogError> {
        let mut files = lock(&self.inner.files);
        self.check_failed()?;
        let spare = mem::take(&mut files.spare);
        let batch = lock(&self.inner.pending).take(spare);
        self.write_batch(&mut files, batch)
    }

    fn apply_snapshot(&self, snap: Snapshot) -> Result<(), LogError> {
        let mut files = lock(&self.inner.files);
        self.check_failed()?;
        let mut pending = lock(&self.inner.pending);
        let hard_state = {
            let core = self.read();
            core.check_apply_snapshot(&snap)?;
            core.hard_state_after(&snap)
        };
        let conf_state = snap.get_metadata().get_conf_state().clone();
        let index = snap.get_metadata().index;
        // The snapshot file says the log continues in a new segment, so a crash at any point
        // below leaves either the old log or the snapshot with nothing after it.
        let seq = files.active.seq() + 1;
        let record = SnapshotRecord {
            first_segment: seq,
            hard_state,
            conf_state,
            snapshot: snap,
        };
        // A snapshot file that cannot be written for want of space changes nothing (it is
        // written aside and renamed into place): the replica waits for space and tries again.
        snapshot_file::write(&self.inner.dir, &record).map_err(|e| {
            if e.for_want_of_space() {
                LogError::NoSpace {
                    dir: self.inner.dir.clone(),
                    cause: e.to_string(),
                }
            } else {
                self.fail(e)
            }
        })?;
        let checkpoint = format::checkpoint(&record.hard_state, &record.conf_state)?;
        files.active =
            ActiveSegment::create(&self.inner.dir, seq, &checkpoint).map_err(|e| self.fail(e))?;
        files.segments.push(SegmentMeta { seq, max_index: 0 });
        let keep = files.segments.len() - 1;
        self.drop_old_files(&mut files, keep, index);
        // What was queued is superseded: its entries are dropped, its states replaced.
        pending.buf.clear();
        pending.max_index = 0;
        pending.hard_state = record.hard_state.clone();
        pending.conf_state = record.conf_state.clone();
        files.hard_state = record.hard_state;
        files.conf_state = record.conf_state;
        self.write().apply_snapshot(record.snapshot);
        Ok(())
    }

    fn compact(&self, index: u64, conf: ConfState, data: Vec<u8>) -> Result<(), LogError> {
        let mut files = lock(&self.inner.files);
        self.check_failed()?;
        let mut pending = lock(&self.inner.pending);
        let Some(snapshot) = self.read().compaction(index, conf, data)? else {
            return Ok(());
        };
        // Everything queued goes to disk first, so the snapshot's hard state is never ahead of
        // the log it is replayed with.
        let spare = mem::take(&mut files.spare);
        let batch = pending.take(spare);
        self.write_batch(&mut files, batch)?;
        // Whole segments go, oldest first, while every entry in them is covered; the active
        // segment always stays.
        let keep = files
            .segments
            .iter()
            .position(|s| s.max_index > index)
            .unwrap_or(files.segments.len() - 1);
        let record = SnapshotRecord {
            first_segment: files.segments[keep].seq,
            hard_state: files.hard_state.clone(),
            conf_state: files.conf_state.clone(),
            snapshot,
        };
        snapshot_file::write(&self.inner.dir, &record)?;
        self.drop_old_files(&mut files, keep, index);
        self.write().compact(record.snapshot);
        Ok(())
    }

    fn bytes_since_snapshot(&self) -> u64 {
        self.read().entry_bytes()
    }
}
