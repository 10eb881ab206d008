//! Opening a log directory: make sure it is ours and no one else has it open, then rebuild the
//! log from the latest snapshot file and the segments after it, cutting a torn last write.
//!
//! The steps, in order:
//! 1. the path must be a directory (created if missing); `LOCK` is locked (`flock`) for as long
//!    as the log is open;
//! 2. `IDENTITY` must name the expected group and replica (a directory without logs gets one);
//! 3. leftovers of an interrupted write are removed: `*.tmp` files, snapshot files older than the
//!    newest, segments before the newest snapshot's first segment;
//! 4. the newest snapshot file gives the starting snapshot, hard state and conf state; the
//!    segments from its first segment on must be consecutive, and are replayed record by record;
//! 5. only the newest segment may end in a torn write, which is cut off (and the cut fsync'd)
//!    and reported as a [`LostTail`]: whether it was ever acknowledged is not always known;
//! 6. the hard state must not commit past the last entry.

use std::fs::{self, File, OpenOptions};
use std::path::{Path, PathBuf};

use nix::errno::Errno;
use nix::fcntl::{Flock, FlockArg};

use super::LogError;
use super::files::{TMP_SUFFIX, remove_stale, sync_dir};
use super::format::{self, RecordKind};
use super::identity::{self, LogIdentity};
use super::log_core::LogCore;
use super::segment::{self, ActiveSegment};
use super::snapshot_file;

/// The name of the lock file in a log directory.
const LOCK_FILE: &str = "LOCK";

/// What a segment holds that matters for deleting it: its highest entry index (0: none).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct SegmentMeta {
    pub(super) seq: u64,
    pub(super) max_index: u64,
}

/// An opened log.
#[derive(Debug)]
pub(super) struct Recovered {
    pub(super) lock: Flock<File>,
    pub(super) core: LogCore,
    /// Oldest first; the last one is `active`.
    pub(super) segments: Vec<SegmentMeta>,
    pub(super) active: ActiveSegment,
    /// The index of the snapshot file on disk, if there is one.
    pub(super) snapshot_index: Option<u64>,
    /// A last write that was torn or damaged, and cut off.
    pub(super) lost_tail: Option<LostTail>,
}

/// The last write of a log, cut off at open because it was torn or damaged. It may have been
/// synced and acknowledged, so what it held (entries, and the ids they gave out) may be lost to
/// this replica:
///
/// - **written whole** (its sync marker is intact after the damage): a disk that lost or
///   flipped bytes it had synced. The write may have been acknowledged, and it held at most
///   [`bytes`](Self::bytes) bytes.
/// - **unfinished** (no sync marker after it): either the process or the machine stopped while
///   writing it (then it was never acknowledged), or the file lost its end after the write was
///   synced (a cut tail: then it may have been acknowledged, and the cut may have taken later
///   writes with it). The bytes cannot tell the two apart, nor how much a cut took.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LostTail {
    /// The segment file.
    pub path: PathBuf,
    /// Where the damage starts.
    pub offset: u64,
    /// How many bytes were cut.
    pub bytes: u64,
    /// Whether the write's sync marker was intact (see above).
    pub written_whole: bool,
}

/// How many ids a cut tail may have held beyond the bytes that are left of it: as if up to
/// 1 MiB of writes had been cut off after them (the head cannot know how much a cut took).
pub const CUT_TAIL_IDS: u64 = 1 << 20;

impl LostTail {
    /// The most task (and node) ids the lost write or writes may have given out: one per byte
    /// of a write damaged after it was written whole; for an unfinished write, one per byte
    /// left of it plus [`CUT_TAIL_IDS`].
    pub fn ids_at_risk(&self) -> u64 {
        if self.written_whole {
            self.bytes.max(1)
        } else {
            self.bytes.saturating_add(CUT_TAIL_IDS)
        }
    }

    /// What the head knows and cannot know about the lost write, for its warnings.
    pub fn describe(&self) -> String {
        let at = format!(
            "{} bytes at offset {} of {}",
            self.bytes,
            self.offset,
            self.path.display()
        );
        if self.written_whole {
            format!(
                "the raft log's last write ({at}) was damaged after it was written whole and \
                 may have been acknowledged"
            )
        } else {
            format!(
                "the raft log ends in a write without its sync marker ({at}): either the head \
                 stopped while writing it (then it was never acknowledged) or the file lost its \
                 end after the write was synced (then it, and any later write the cut took, \
                 may have been acknowledged); the log cannot tell which, nor how many bytes a \
                 cut took"
            )
        }
    }
}

/// Opens (or creates) the log in `dir`.
pub(super) fn recover(dir: &Path, identity: &LogIdentity) -> Result<Recovered, LogError> {
    let lock = prepare_dir(dir)?;
    let listing = list(dir)?;
    identity::ensure(
        dir,
        identity,
        listing.segments.is_empty() && listing.snapshots.is_empty(),
    )?;

    let (mut core, first_segment, snapshot_index) = match listing.snapshots.last() {
        Some(&index) => {
            let record = snapshot_file::read(&dir.join(snapshot_file::file_name(index)))?;
            for &older in &listing.snapshots[..listing.snapshots.len() - 1] {
                remove_stale(&dir.join(snapshot_file::file_name(older)));
            }
            let core = LogCore::from_parts(record.snapshot, record.hard_state, record.conf_state);
            (core, record.first_segment, Some(index))
        }
        None => (LogCore::default(), 1, None),
    };

    let mut seqs = Vec::with_capacity(listing.segments.len());
    for seq in listing.segments {
        if seq < first_segment {
            remove_stale(&dir.join(segment::file_name(seq)));
        } else {
            seqs.push(seq);
        }
    }
    for (expected, &seq) in (first_segment..).zip(&seqs) {
        if seq != expected {
            return Err(LogError::Inconsistent {
                dir: dir.to_path_buf(),
                detail: format!("segment {} is missing", segment::file_name(expected)),
            });
        }
    }

    let mut segments = Vec::with_capacity(seqs.len());
    let mut active_len = 0;
    let mut lost_tail = None;
    for (i, &seq) in seqs.iter().enumerate() {
        let path = dir.join(segment::file_name(seq));
        let bytes = fs::read(&path).map_err(LogError::io("read", &path))?;
        let mut max_index = 0;
        let newest = i + 1 == seqs.len();
        let scanned = segment::scan(&path, &bytes, newest, |kind, payload| match kind {
            RecordKind::Entries => {
                let ents = format::decode_entries(payload)?;
                max_index = max_index.max(ents.last().map_or(0, |e| e.index));
                core.replay_append(ents)
            }
            RecordKind::HardState => {
                core.set_hard_state(format::decode_hard_state(payload)?);
                Ok(())
            }
            RecordKind::ConfState => {
                core.set_conf_state(format::decode_conf_state(payload)?);
                Ok(())
            }
            RecordKind::Snapshot | RecordKind::Sync => {
                Err(format!("a {kind:?} record inside a segment"))
            }
        })?;
        if let Some(why) = scanned.torn_why {
            let lost = LostTail {
                path: path.clone(),
                offset: scanned.valid_len,
                bytes: scanned.torn,
                written_whole: scanned.written_whole,
            };
            if lost.written_whole {
                tracing::error!(
                    path = %path.display(),
                    offset = scanned.valid_len,
                    dropped_bytes = scanned.torn,
                    why = %why.describe(),
                    "the last write of the raft log was damaged after it was written whole (its \
                     sync marker is intact): it may have been acknowledged, and what it held is \
                     lost to this replica; cut it off (a replica of a group gets it back from the \
                     leader; a lone head skips the ids it may have given out)"
                );
            } else {
                tracing::warn!(
                    path = %path.display(),
                    offset = scanned.valid_len,
                    dropped_bytes = scanned.torn,
                    why = %why.describe(),
                    ids_skipped = lost.ids_at_risk(),
                    "cut a write without its sync marker off the end of the raft log: the head \
                     stopped while writing it (never acknowledged), or the file lost its end \
                     after it was synced (it, and later writes the cut took, may have been \
                     acknowledged); the log cannot tell which, so it counts what it held as \
                     lost (a replica of a group gets it back from the leader; a lone head skips \
                     the ids it may have given out)"
                );
            }
            lost_tail = Some(lost);
        }
        if scanned.valid_len == 0 {
            // Not even the header made it: the segment was being created.
            remove_stale(&path);
            sync_dir(dir)?;
            continue;
        }
        active_len = scanned.valid_len;
        segments.push(SegmentMeta { seq, max_index });
    }

    let snapshot_at = core.snapshot_index();
    let mut hs = core.hard_state().clone();
    if hs.commit < snapshot_at {
        // A snapshot holds only committed state; raft-rs refuses a commit below it.
        hs.commit = snapshot_at;
        core.set_hard_state(hs.clone());
    }
    if hs.commit > core.last_index() {
        return Err(LogError::Inconsistent {
            dir: dir.to_path_buf(),
            detail: format!(
                "the hard state commits entry {} but the log ends at {}",
                hs.commit,
                core.last_index()
            ),
        });
    }

    let active = match segments.last() {
        Some(last) => ActiveSegment::reopen(dir, last.seq, active_len)?,
        None => {
            let checkpoint = format::checkpoint(core.hard_state(), core.conf_state())?;
            let seq = seqs.first().copied().unwrap_or(first_segment);
            let active = ActiveSegment::create(dir, seq, &checkpoint)?;
            segments.push(SegmentMeta { seq, max_index: 0 });
            active
        }
    };
    Ok(Recovered {
        lock,
        core,
        segments,
        active,
        snapshot_index,
        lost_tail,
    })
}

/// Makes sure `dir` is a directory and takes its lock.
fn prepare_dir(dir: &Path) -> Result<Flock<File>, LogError> {
    match fs::metadata(dir) {
        Ok(meta) if meta.is_dir() => {}
        Ok(_) => {
            return Err(LogError::NotADirectory {
                path: dir.to_path_buf(),
            });
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            fs::create_dir_all(dir).map_err(LogError::io("create directory", dir))?;
            if let Some(parent) = dir.parent().filter(|p| !p.as_os_str().is_empty()) {
                sync_dir(parent)?;
            }
        }
        Err(e) => return Err(LogError::io("read", dir)(e)),
    }
    let path = dir.join(LOCK_FILE);
    let file = OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(&path)
        .map_err(LogError::io("open", &path))?;
    Flock::lock(file, FlockArg::LockExclusiveNonblock).map_err(|(_, errno)| match errno {
        Errno::EWOULDBLOCK => LogError::Locked {
            dir: dir.to_path_buf(),
        },
        other => LogError::io("lock", &path)(other.into()),
    })
}

/// The log files in a directory, sorted.
#[derive(Debug, Default)]
struct Listing {
    segments: Vec<u64>,
    snapshots: Vec<u64>,
}

/// Lists `dir`, removing `*.tmp` leftovers of an interrupted atomic write.
fn list(dir: &Path) -> Result<Listing, LogError> {
    let mut listing = Listing::default();
    let entries = fs::read_dir(dir).map_err(LogError::io("read directory", dir))?;
    for entry in entries {
        let entry = entry.map_err(LogError::io("read directory", dir))?;
        let name = entry.file_name();
        let Some(name) = name.to_str() else { continue };
        if let Some(seq) = segment::parse_name(name) {
            listing.segments.push(seq);
        } else if let Some(index) = snapshot_file::parse_name(name) {
            listing.snapshots.push(index);
        } else if name.ends_with(TMP_SUFFIX) {
            remove_stale(&entry.path());
        }
    }
    listing.segments.sort_unstable();
    listing.snapshots.sort_unstable();
    Ok(listing)
}
