//! [`ObjectError`]: what the object store refuses, and why.
//!
//! Every case names the object. Refusals caused by the caller (a size that cannot fit, a
//! checksum or a length that does not match, an id in use, an id that is not there) leave the
//! store as it was; [`ObjectError::Io`] is the machine's (a full or unwritable directory).

use std::io;
use std::path::PathBuf;

use super::ObjectId;

/// An object store operation that failed.
#[derive(Debug, thiserror::Error)]
pub enum ObjectError {
    /// The object does not fit in memory even after spilling every object that may be spilled.
    #[error(
        "object {id} of {size} bytes does not fit in the object store's {capacity} bytes: \
         {pinned} bytes are pinned by readers or being written, and spilling every other object \
         frees only {spillable}; raise --object-store-memory, or release objects first"
    )]
    TooLarge {
        /// The object.
        id: ObjectId,
        /// Its size.
        size: u64,
        /// The store's capacity in memory.
        capacity: u64,
        /// Bytes in memory that no spill can free: pinned objects and writers' reservations.
        pinned: u64,
        /// Bytes in memory that spilling could free.
        spillable: u64,
    },
    /// The spill directory's disk cannot take what would have to be spilled to make room.
    #[error(
        "object {id} of {size} bytes needs {need} bytes spilled to {dir} to make room, and that \
         disk has {available} bytes free; free disk space there, or release objects first"
    )]
    SpillDiskFull {
        /// The object being made room for.
        id: ObjectId,
        /// Its size.
        size: u64,
        /// The bytes that would have to move to disk.
        need: u64,
        /// The bytes free on the spill disk.
        available: u64,
        /// The spill directory.
        dir: PathBuf,
    },
    /// The object's memory directory (tmpfs) is full, though the store's capacity allows it:
    /// the capacity is larger than the filesystem (a container's small `/dev/shm`).
    #[error(
        "object {id} of {size} bytes does not fit in {dir}: that filesystem is full; make it \
         larger (a container's --shm-size) or lower --object-store-memory below its size"
    )]
    MemoryDirFull {
        /// The object.
        id: ObjectId,
        /// Its size.
        size: u64,
        /// The memory directory.
        dir: PathBuf,
    },
    /// An object of this id is stored or being written already.
    #[error("object {id} exists already (stored or being written); objects are written once")]
    Exists {
        /// The object.
        id: ObjectId,
    },
    /// No sealed object of this id is here (never stored, still being written, or deleted).
    #[error(
        "object {id} is not in this node's object store (never stored here, not sealed yet, or released)"
    )]
    NotFound {
        /// The object.
        id: ObjectId,
    },
    /// A write that goes past the object's end.
    #[error(
        "object {id} is {size} bytes: a write of {len} bytes at offset {offset} goes past its end"
    )]
    OutOfBounds {
        /// The object.
        id: ObjectId,
        /// Its size.
        size: u64,
        /// Where the write started.
        offset: u64,
        /// How long it was.
        len: u64,
    },
    /// A seal before every byte of the object was written; the object is dropped.
    #[error(
        "object {id} is incomplete: {written} of its {size} bytes were written before the seal; \
         the copy was dropped"
    )]
    Incomplete {
        /// The object.
        id: ObjectId,
        /// Its size.
        size: u64,
        /// The bytes written (ranges written twice counted once).
        written: u64,
    },
    /// The bytes written are not those the caller vouched for; the object is dropped.
    #[error(
        "object {id} is corrupt: its {size} bytes have CRC-32C {actual:#010x}, not the \
         {expected:#010x} expected; the copy was dropped"
    )]
    ChecksumMismatch {
        /// The object.
        id: ObjectId,
        /// Its size.
        size: u64,
        /// The checksum the caller gave.
        expected: u32,
        /// The checksum of what was written.
        actual: u32,
    },
    /// A file operation of the store failed.
    #[error("object store: cannot {what} {}: {source}", path.display())]
    Io {
        /// What the store was doing (`"create"`, `"map"`, `"spill object 7.0 to"`, ...).
        what: String,
        /// The file or directory.
        path: PathBuf,
        /// Why.
        #[source]
        source: io::Error,
    },
}

impl ObjectError {
    /// An [`ObjectError::Io`].
    pub(super) fn io(what: impl Into<String>, path: impl Into<PathBuf>, source: io::Error) -> Self {
        ObjectError::Io {
            what: what.into(),
            path: path.into(),
            source,
        }
    }
}
