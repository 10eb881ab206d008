//! [`ObjectView`]: a sealed object, memory-mapped read-only and pinned while it lives.
//!
//! The bytes are the file's pages themselves (tmpfs pages, or the page cache of a spill file
//! mapped in place): nothing is copied. [`ObjectView::bytes`] hands them out as
//! [`bytes::Bytes`] that keep the mapping, and the pin, alive however long they are held.
//!
//! Unsafe code: one `mmap` ([`memmap2::Mmap::map`]). A mapping is sound while no one changes
//! or truncates the file under it. The store guarantees that for its own part: a file is
//! complete and made read-only (mode 0444) before it becomes visible, it is never written
//! again, and a pinned file is neither moved nor unlinked (an unlink would keep the pages
//! anyway). The directory belongs to the worker's user, so only that user (or root) could
//! change a sealed file, and a reader's memory is then what it reads.
#![allow(unsafe_code)]

use std::fmt;
use std::fs::File;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use bytes::Bytes;

use super::{ObjectError, ObjectId, store::Pin};

/// A sealed object's bytes, mapped, and pinned in place: while a view (or a [`Bytes`] from
/// [`ObjectView::bytes`]) lives, the object is neither spilled, moved nor unlinked, so its
/// [`path`](ObjectView::path) stays valid for a same-node reader that maps it itself. A clone
/// shares the mapping and the pin.
#[derive(Clone)]
pub struct ObjectView {
    id: ObjectId,
    crc32c: u32,
    sums: Option<Arc<[u32]>>,
    path: PathBuf,
    bytes: Bytes,
}

/// What keeps a mapping and its pin alive behind [`Bytes`].
struct Mapped {
    map: memmap2::Mmap,
    _pin: Arc<Pin>,
}

impl AsRef<[u8]> for Mapped {
    fn as_ref(&self) -> &[u8] {
        &self.map
    }
}

impl ObjectView {
    /// Maps the sealed file at `path`, which `pin` holds in place.
    pub(super) fn map(
        id: ObjectId,
        size: u64,
        crc32c: u32,
        sums: Option<Arc<[u32]>>,
        path: PathBuf,
        pin: Arc<Pin>,
    ) -> Result<ObjectView, ObjectError> {
        let file = File::open(&path).map_err(|e| ObjectError::io("open", &path, e))?;
        // SAFETY: see the module doc: the file is sealed (complete, read-only, never written
        // again) and pinned (neither moved nor truncated) for as long as the mapping lives,
        // which the `Mapped` owner ties to the pin.
        let map =
            unsafe { memmap2::Mmap::map(&file) }.map_err(|e| ObjectError::io("map", &path, e))?;
        if map.len() as u64 != size {
            return Err(ObjectError::io(
                format!("map object {id} ({size} bytes) from"),
                &path,
                std::io::Error::new(
                    std::io::ErrorKind::InvalidData,
                    format!("the file holds {} bytes", map.len()),
                ),
            ));
        }
        let bytes = Bytes::from_owner(Mapped { map, _pin: pin });
        Ok(ObjectView {
            id,
            crc32c,
            sums,
            path,
            bytes,
        })
    }

    /// The object.
    pub fn id(&self) -> ObjectId {
        self.id
    }

    /// Its size in bytes.
    pub fn len(&self) -> u64 {
        self.bytes.len() as u64
    }

    /// Whether it is empty (a 0-byte object).
    pub fn is_empty(&self) -> bool {
        self.bytes.is_empty()
    }

    /// The CRC-32C of its bytes, as checked when it was sealed.
    pub fn crc32c(&self) -> u32 {
        self.crc32c
    }

    /// The CRC-32C of each [`CHUNK_BYTES`](escher_proto::transfer::CHUNK_BYTES) block of
    /// its bytes (the last one shorter), when its writer summed them as they came.
    pub fn block_sums(&self) -> Option<Arc<[u32]>> {
        self.sums.clone()
    }

    /// Its bytes, in place.
    pub fn as_slice(&self) -> &[u8] {
        &self.bytes
    }

    /// Its bytes as [`Bytes`] over the same mapping (no copy): each clone keeps the object
    /// pinned, so they may outlive the view (a gRPC response body, a task's argument).
    pub fn bytes(&self) -> Bytes {
        self.bytes.clone()
    }

    /// The sealed file, for a reader on this node (a task's process, a Python interpreter) to
    /// open and map read-only itself; valid while this view lives. It is in the memory
    /// directory, or in the spill directory for an object read where it was spilled.
    pub fn path(&self) -> &Path {
        &self.path
    }
}

impl AsRef<[u8]> for ObjectView {
    fn as_ref(&self) -> &[u8] {
        &self.bytes
    }
}

impl fmt::Debug for ObjectView {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ObjectView")
            .field("id", &self.id)
            .field("len", &self.bytes.len())
            .field("crc32c", &format_args!("{:#010x}", self.crc32c))
            .field("path", &self.path)
            .finish()
    }
}
