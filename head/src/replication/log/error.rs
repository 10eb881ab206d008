//! Why the raft log refused to open or to write.
//!
//! The variants fall in three groups: the directory is not ours or not usable (`NotADirectory`,
//! `Locked`, `WrongGroup`, `WrongReplica`, `UnsupportedFormat`, `InvalidIdentity`, `Io`), the
//! bytes on disk are damaged (`Corrupt`, `Inconsistent`), and the caller broke raft's rules for a
//! log (`Compacted`, `Unavailable`, `Gap`, `NotContiguous`, `SnapshotOutOfDate`). After an I/O
//! error while writing, the store refuses every later write with `Failed`: what reached the disk
//! is then unknown, and the only safe course is to restart from what recovery finds.
//! [`From<LogError> for raft::Error`](LogError) maps the raft-rule cases to the `StorageError`
//! kinds raft-rs understands and wraps everything else as `StorageError::Other`.

use std::path::PathBuf;

use raft::StorageError;
use thiserror::Error;

/// What to tell an operator whose log is damaged.
const RECOVER: &str = "if this head is one replica of a group, move the directory aside and \
                       restart it empty so that it catches up from the leader; a single head's \
                       log cannot be repaired by escher (restore the directory from a backup)";

/// Why the raft log refused an operation. A refused write changes nothing.
#[derive(Debug, Error)]
pub enum LogError {
    /// A file or directory operation failed.
    #[error("cannot {action} {}: {source}{}", path.display(), io_hint(source))]
    Io {
        /// What the log was doing (`open`, `write`, `fsync`, ...).
        action: &'static str,
        /// The file or directory it was doing it to.
        path: PathBuf,
        /// The operating system's error.
        source: std::io::Error,
    },
    /// The log's path exists but is not a directory.
    #[error(
        "{} exists and is not a directory; give the head a directory of its own for its data \
         (--data-dir)",
        path.display()
    )]
    NotADirectory {
        /// The path.
        path: PathBuf,
    },
    /// Another process (or another `DiskLog` in this one) has the directory open.
    #[error(
        "{} is in use by another process (another escher-head?); stop that process, or give \
         this head a data directory of its own (--data-dir)",
        dir.display()
    )]
    Locked {
        /// The log directory.
        dir: PathBuf,
    },
    /// The directory holds the log of another raft group.
    #[error(
        "{} holds the log of group {found:?}, but this head is in group {expected:?}; point \
         --data-dir at this group's directory, or at an empty one to join as a new replica",
        dir.display()
    )]
    WrongGroup {
        /// The log directory.
        dir: PathBuf,
        /// The group recorded in the directory.
        found: String,
        /// The group of this head.
        expected: String,
    },
    /// The directory holds the log of another replica of this group.
    #[error(
        "{} holds the log of replica {found}, but this head is replica {expected} (--id); start \
         it with --id {found}, or give replica {expected} its own data directory",
        dir.display()
    )]
    WrongReplica {
        /// The log directory.
        dir: PathBuf,
        /// The replica recorded in the directory.
        found: u64,
        /// The replica id of this head.
        expected: u64,
    },
    /// The disk (or quota) of the log is full: the write that failed is kept, nothing of it
    /// counts, and it is written when space returns. The head refuses writes meanwhile and
    /// serves reads.
    #[error(
        "no space left for the raft log in {}: {cause}; writes are refused until space is freed \
         there (reads go on), then resume by themselves",
        dir.display()
    )]
    NoSpace {
        /// The log directory.
        dir: PathBuf,
        /// The operating system's error.
        cause: String,
    },
    /// A file was written by a format this build does not know.
    #[error(
        "{} is in raft log format {found}, but this escher-head reads format {supported}; run \
         the escher-head release that wrote it",
        path.display()
    )]
    UnsupportedFormat {
        /// The file.
        path: PathBuf,
        /// The format version in the file.
        found: u32,
        /// The only version this build reads.
        supported: u32,
    },
    /// The identity given to `open` cannot be recorded.
    #[error("invalid raft log identity: {why}")]
    InvalidIdentity {
        /// What is wrong with it.
        why: String,
    },
    /// A checksum, a header or a record's contents are wrong somewhere other than at the very end
    /// of the newest segment (where a torn write is expected and truncated).
    #[error(
        "the raft log is damaged: {} at byte {offset}: {detail}; {RECOVER}",
        path.display()
    )]
    Corrupt {
        /// The damaged file.
        path: PathBuf,
        /// Where in it the damage starts.
        offset: u64,
        /// What was found there.
        detail: String,
    },
    /// Every file checks out, but together they do not form a log (a segment is missing, the
    /// hard state commits entries the log does not have).
    #[error("the raft log in {} is inconsistent: {detail}; {RECOVER}", dir.display())]
    Inconsistent {
        /// The log directory.
        dir: PathBuf,
        /// What does not fit.
        detail: String,
    },
    /// An append or a term lookup reached below the first entry still in the log.
    #[error("entry {index} is compacted (the log starts at {first_index})")]
    Compacted {
        /// The index asked for.
        index: u64,
        /// The first index the log still has.
        first_index: u64,
    },
    /// A compaction named an entry the log does not have yet.
    #[error("entry {index} is not in the log (it ends at {last_index})")]
    Unavailable {
        /// The index asked for.
        index: u64,
        /// The last index the log has.
        last_index: u64,
    },
    /// An append would leave a hole after the last entry.
    #[error("appending at {index} would leave a gap after the last entry {last_index}")]
    Gap {
        /// The first index of the append.
        index: u64,
        /// The last index the log has.
        last_index: u64,
    },
    /// The entries of one append do not have consecutive indexes.
    #[error("the entries to append are not consecutive: {expected} expected, {found} found")]
    NotContiguous {
        /// The index that should have come next.
        expected: u64,
        /// The index that came.
        found: u64,
    },
    /// A snapshot to install is older than what the log already covers.
    #[error("snapshot at {index} is out of date: the log already starts at {first_index}")]
    SnapshotOutOfDate {
        /// The snapshot's index.
        index: u64,
        /// The first index the log has.
        first_index: u64,
    },
    /// One record would exceed the format's 4 GiB record limit.
    #[error("a record of {bytes} bytes exceeds the raft log's limit of 4 GiB")]
    TooLarge {
        /// Its size.
        bytes: usize,
    },
    /// rust-protobuf refused to encode one of raft's messages (it does so only for messages
    /// with missing proto2 `required` fields, which raft's proto3 messages do not have).
    #[error("cannot encode a raft message: {detail}; this is a bug in escher, please report it")]
    Encode {
        /// rust-protobuf's error.
        detail: String,
    },
    /// An earlier write or fsync failed, so what is on disk is unknown.
    #[error(
        "the raft log stopped taking writes after an earlier failure ({cause}); restart the \
         head so that it recovers from what is on disk"
    )]
    Failed {
        /// The first failure.
        cause: String,
    },
}

/// What an operator can do about an I/O error, where there is something obvious.
fn io_hint(e: &std::io::Error) -> &'static str {
    use std::io::ErrorKind;
    match e.kind() {
        ErrorKind::PermissionDenied => {
            "; let the user running escher-head read and write it, or choose another --data-dir"
        }
        ErrorKind::StorageFull => "; free some space on that file system",
        ErrorKind::ReadOnlyFilesystem => {
            "; the file system is read-only: choose another --data-dir"
        }
        ErrorKind::NotADirectory => "; a part of the path is a file, not a directory",
        _ => "",
    }
}

impl LogError {
    /// Whether this write was refused for want of space (the disk, or the user's quota): the
    /// log's own `NoSpace`, or creating or writing a file failing with `ENOSPC` or `EDQUOT`.
    /// Nothing of such a write counts, and the log takes writes again once space is freed. (A
    /// failed fsync is never one: the kernel may have dropped the pages it could not write.)
    pub fn for_want_of_space(&self) -> bool {
        match self {
            LogError::NoSpace { .. } => true,
            LogError::Io { action, source, .. } => {
                matches!(*action, "write" | "create")
                    && matches!(
                        source.raw_os_error(),
                        Some(code) if code == nix::errno::Errno::ENOSPC as i32
                            || code == nix::errno::Errno::EDQUOT as i32
                    )
            }
            _ => false,
        }
    }

    /// Wraps an I/O error with what was being done to which path.
    pub(crate) fn io(
        action: &'static str,
        path: impl Into<PathBuf>,
    ) -> impl FnOnce(std::io::Error) -> Self {
        let path = path.into();
        move |source| LogError::Io {
            action,
            path,
            source,
        }
    }
}

impl From<LogError> for raft::Error {
    fn from(e: LogError) -> Self {
        match e {
            LogError::Compacted { .. } => raft::Error::Store(StorageError::Compacted),
            LogError::Unavailable { .. } => raft::Error::Store(StorageError::Unavailable),
            LogError::SnapshotOutOfDate { .. } => {
                raft::Error::Store(StorageError::SnapshotOutOfDate)
            }
            other => raft::Error::Store(StorageError::Other(Box::new(other))),
        }
    }
}
