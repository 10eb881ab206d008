//! [`ObjectWriter`]: one object being written, invisible until it is sealed whole.
//!
//! The bytes go to a hidden file (`.OWNER.INDEX.KEY.part`) in the store's memory directory,
//! whose space is reserved at the start (`fallocate`), so a full tmpfs refuses the object at
//! [`ObjectStore::create`](super::ObjectStore::create) rather than half-way. A copy streamed in
//! from the network ([`ObjectStore::create_streamed`](super::ObjectStore::create_streamed))
//! skips the `fallocate`, which zeroes every page before the copy overwrites it: its room is
//! checked instead (the filesystem's free bytes beside what other streamed writers have still
//! to write), and a write that finds the filesystem full after all refuses the copy, which is
//! then removed like any unsealed one. Writes may come in
//! any order and overlap (a fetch that resumes from another holder writes a range again);
//! [`ObjectWriter::seal`] then checks that every byte was written and that the whole object's
//! CRC-32C is the one the caller vouches for, makes the file read-only and renames it to its
//! visible name. A refused seal, an [`ObjectWriter::abort`], or a writer dropped unsealed,
//! removes the file and gives back the reservation: nothing is left behind.
//!
//! The checksum is computed as the bytes arrive while they arrive in order (the common case: a
//! put, a fetch's chunks), or combined from the sums of chunks the caller has checked already
//! ([`ObjectWriter::write_summed`]: a fetch's or a push's, so their bytes are summed once);
//! otherwise the seal reads the file once to compute it.

use std::fmt;
use std::fs::{self, File, OpenOptions};
use std::io;
use std::os::unix::fs::{FileExt, OpenOptionsExt, PermissionsExt};
use std::path::PathBuf;
use std::sync::Arc;

use nix::fcntl::{FallocateFlags, fallocate};

use super::store::{Inner, ObjectInfo, partial_name};
use super::table::Key;
use super::{ObjectError, ObjectId};

/// The blocks whose checksums a sealed object keeps: a holder's chunks, so that it sends
/// each chunk's checksum without summing it again.
const BLOCK: usize = escher_proto::transfer::CHUNK_BYTES;

/// How much of the file a seal reads at a time when it must compute the checksum itself.
const READ_CHUNK: usize = 1 << 20;

/// How a writer makes sure the memory directory's filesystem has room for its object.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Room {
    /// Allocated up front (`fallocate`).
    Allocated,
    /// Checked free, and promised among the store's streamed writers.
    Checked,
}

/// An object being written; see the module doc.
pub struct ObjectWriter {
    inner: Arc<Inner>,
    id: ObjectId,
    size: u64,
    key: Key,
    file: File,
    path: PathBuf,
    written: Ranges,
    /// The checksum of bytes `0..in_order.0`, while every write so far came in order.
    in_order: Option<(u64, u32)>,
    /// While every write came in order and split at block boundaries: the checksums of the
    /// [`BLOCK`]s written whole, and of the block being written with its length so far.
    sums: Option<(Vec<u32>, u32, usize)>,
    /// The bytes of [`Room::Checked`] room promised and not written yet.
    promised: u64,
    sealed: bool,
}

impl ObjectWriter {
    /// Creates the hidden file of copy `key` of `id`, whose `size` bytes the store reserved.
    pub(super) fn start(
        inner: Arc<Inner>,
        id: ObjectId,
        size: u64,
        key: Key,
        room: Room,
    ) -> Result<ObjectWriter, ObjectError> {
        if room == Room::Checked
            && let Err(e) = inner.promise(id, size)
        {
            inner.abandon(id);
            return Err(e);
        }
        let promised = if room == Room::Checked { size } else { 0 };
        let path = inner.memory_dir().join(partial_name(id, key));
        let file = OpenOptions::new()
            .write(true)
            .read(true)
            .create_new(true)
            .mode(0o600)
            .open(&path);
        let file = match file {
            Ok(file) => file,
            Err(e) => {
                inner.unpromise(promised);
                inner.abandon(id);
                return Err(ObjectError::io(format!("create object {id} as"), &path, e));
            }
        };
        let writer = ObjectWriter {
            inner,
            id,
            size,
            key,
            file,
            path,
            written: Ranges::default(),
            in_order: Some((0, 0)),
            sums: Some((Vec::new(), 0, 0)),
            promised,
            sealed: false,
        };
        // Dropped on error: the file is removed and the reservation given back.
        if room == Room::Allocated {
            writer.allocate()?;
        }
        Ok(writer)
    }

    /// Reserves the object's bytes in the memory directory's filesystem.
    fn allocate(&self) -> Result<(), ObjectError> {
        if self.size == 0 {
            return Ok(());
        }
        let len = i64::try_from(self.size).map_err(|_| self.full())?;
        match fallocate(&self.file, FallocateFlags::empty(), 0, len) {
            Ok(()) => Ok(()),
            Err(nix::errno::Errno::ENOSPC) | Err(nix::errno::Errno::EFBIG) => Err(self.full()),
            // A filesystem without fallocate: the size only (space is then taken as written).
            Err(nix::errno::Errno::EOPNOTSUPP) => self
                .file
                .set_len(self.size)
                .map_err(|e| ObjectError::io(format!("size object {}", self.id), &self.path, e)),
            Err(e) => Err(ObjectError::io(
                format!("allocate object {}", self.id),
                &self.path,
                e.into(),
            )),
        }
    }

    fn full(&self) -> ObjectError {
        ObjectError::MemoryDirFull {
            id: self.id,
            size: self.size,
            dir: self.inner.memory_dir().to_path_buf(),
        }
    }

    /// The object.
    pub fn id(&self) -> ObjectId {
        self.id
    }

    /// Its size in bytes, as created.
    pub fn size(&self) -> u64 {
        self.size
    }

    /// How many of its bytes were written so far (a range written twice counts once).
    pub fn written(&self) -> u64 {
        self.written.total()
    }

    /// Writes `data` at `offset` (a chunk of a fetch, in any order). A write past the end is
    /// refused and writes nothing.
    pub fn write_at(&mut self, offset: u64, data: &[u8]) -> Result<(), ObjectError> {
        self.write(offset, data, None)
    }

    /// [`write_at`](Self::write_at) of bytes whose CRC-32C the caller has already computed
    /// (a chunk it checked), so that they are not summed a second time. A wrong `crc32c` is
    /// not caught here: the seal would then refuse a whole object whose bytes are right.
    pub fn write_summed(
        &mut self,
        offset: u64,
        data: &[u8],
        crc32c: u32,
    ) -> Result<(), ObjectError> {
        self.write(offset, data, Some(crc32c))
    }

    fn write(&mut self, offset: u64, data: &[u8], summed: Option<u32>) -> Result<(), ObjectError> {
        let len = data.len() as u64;
        let end = offset.checked_add(len).filter(|&end| end <= self.size);
        let Some(end) = end else {
            return Err(ObjectError::OutOfBounds {
                id: self.id,
                size: self.size,
                offset,
                len,
            });
        };
        self.file.write_all_at(data, offset).map_err(|e| {
            if e.raw_os_error() == Some(nix::libc::ENOSPC) {
                self.full()
            } else {
                ObjectError::io(format!("write object {}", self.id), &self.path, e)
            }
        })?;
        self.in_order = match self.in_order {
            Some((next, crc)) if next == offset => {
                Some((end, self.sum_in_order(crc, data, summed)))
            }
            _ => {
                self.sums = None;
                None
            }
        };
        let before = self.written.total();
        self.written.add(offset, end);
        if self.promised > 0 {
            let taken = (self.written.total() - before).min(self.promised);
            self.promised -= taken;
            self.inner.unpromise(taken);
        }
        Ok(())
    }

    /// The checksum of the bytes in order up to the end of `data`, from `crc` before it, with
    /// the block checksums kept up: `data` is summed once, block by block, unless the caller
    /// `summed` it already (then the blocks are kept only while it lies within one).
    fn sum_in_order(&mut self, crc: u32, data: &[u8], summed: Option<u32>) -> u32 {
        if let Some(piece) = summed {
            if let Some((_, block, fill)) = &mut self.sums {
                if *fill + data.len() <= BLOCK {
                    *block = crc32c::crc32c_combine(*block, piece, data.len());
                    *fill += data.len();
                } else {
                    self.sums = None;
                }
            }
            self.close_block();
            return crc32c::crc32c_combine(crc, piece, data.len());
        }
        let Some((_, _, fill)) = &self.sums else {
            return crc32c::crc32c_append(crc, data);
        };
        let (mut crc, mut rest, mut room) = (crc, data, BLOCK - fill);
        while !rest.is_empty() {
            let (part, after) = rest.split_at(room.min(rest.len()));
            let sum = crc32c::crc32c(part);
            crc = crc32c::crc32c_combine(crc, sum, part.len());
            if let Some((_, block, fill)) = &mut self.sums {
                *block = crc32c::crc32c_combine(*block, sum, part.len());
                *fill += part.len();
            }
            self.close_block();
            (rest, room) = (after, BLOCK);
        }
        crc
    }

    /// Files the block being written once it is whole.
    fn close_block(&mut self) {
        if let Some((blocks, block, fill)) = &mut self.sums
            && *fill == BLOCK
        {
            blocks.push(*block);
            (*block, *fill) = (0, 0);
        }
    }

    /// Writes `data` right after the bytes written so far from the start (a put, or a fetch
    /// whose chunks arrive in order).
    pub fn append(&mut self, data: &[u8]) -> Result<(), ObjectError> {
        let offset = self.written.prefix();
        self.write_at(offset, data)
    }

    /// Seals the object: checks that all of it was written and that its CRC-32C is
    /// `crc32c`, then makes it read-only and visible to [`get`](super::ObjectStore::get).
    /// Refused ([`ObjectError::Incomplete`], [`ObjectError::ChecksumMismatch`]) with the copy
    /// removed.
    pub fn seal(mut self, crc32c: u32) -> Result<ObjectInfo, ObjectError> {
        let written = self.written.total();
        if written != self.size {
            return Err(ObjectError::Incomplete {
                id: self.id,
                size: self.size,
                written,
            });
        }
        let (actual, sums) = match self.in_order {
            Some((next, crc)) if next == self.size => {
                let sums = self.sums.take().map(|(mut blocks, block, fill)| {
                    if fill > 0 {
                        blocks.push(block);
                    }
                    Arc::<[u32]>::from(blocks)
                });
                (crc, sums)
            }
            _ => (self.checksum()?, None),
        };
        if actual != crc32c {
            return Err(ObjectError::ChecksumMismatch {
                id: self.id,
                size: self.size,
                expected: crc32c,
                actual,
            });
        }
        self.file
            .set_permissions(fs::Permissions::from_mode(0o444))
            .map_err(|e| {
                ObjectError::io(format!("make object {} read-only:", self.id), &self.path, e)
            })?;
        self.inner
            .seal(&self.path, self.key, self.id, self.size, crc32c, sums)?;
        self.sealed = true;
        Ok(ObjectInfo {
            id: self.id,
            size: self.size,
            crc32c,
        })
    }

    /// Drops the object: its file is removed and its reservation given back (as a drop does).
    pub fn abort(self) {}

    /// The CRC-32C of the whole file, read back.
    fn checksum(&self) -> Result<u32, ObjectError> {
        let mut buf = vec![0; READ_CHUNK.min(self.size as usize)];
        let (mut offset, mut crc) = (0, 0);
        while offset < self.size {
            let n = (self.size - offset).min(buf.len() as u64) as usize;
            self.file
                .read_exact_at(&mut buf[..n], offset)
                .map_err(|e| {
                    ObjectError::io(format!("read back object {}", self.id), &self.path, e)
                })?;
            crc = crc32c::crc32c_append(crc, &buf[..n]);
            offset += n as u64;
        }
        Ok(crc)
    }
}

impl Drop for ObjectWriter {
    fn drop(&mut self) {
        self.inner.unpromise(self.promised);
        if self.sealed {
            return;
        }
        if let Err(e) = fs::remove_file(&self.path)
            && e.kind() != io::ErrorKind::NotFound
        {
            tracing::warn!(object = %self.id, path = %self.path.display(), %e, "cannot remove an unsealed object's file");
        }
        self.inner.abandon(self.id);
    }
}

impl fmt::Debug for ObjectWriter {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ObjectWriter")
            .field("id", &self.id)
            .field("size", &self.size)
            .field("written", &self.written.total())
            .finish_non_exhaustive()
    }
}

/// The byte ranges written so far, disjoint and sorted, touching ones merged.
#[derive(Debug, Default)]
struct Ranges(Vec<(u64, u64)>);

impl Ranges {
    /// Adds `start..end`.
    fn add(&mut self, start: u64, end: u64) {
        if start == end {
            return;
        }
        // The common case, in-order writes: extend the last range.
        if let Some(last) = self.0.last_mut()
            && last.0 <= start
            && start <= last.1
        {
            last.1 = last.1.max(end);
            return;
        }
        let (mut start, mut end) = (start, end);
        self.0.retain(|&(s, e)| {
            let apart = e < start || end < s;
            if !apart {
                start = start.min(s);
                end = end.max(e);
            }
            apart
        });
        let at = self.0.partition_point(|&(s, _)| s < start);
        self.0.insert(at, (start, end));
    }

    /// The bytes covered.
    fn total(&self) -> u64 {
        self.0.iter().map(|(s, e)| e - s).sum()
    }

    /// Where the range that starts at 0 ends (0 when none does).
    fn prefix(&self) -> u64 {
        match self.0.first() {
            Some(&(0, end)) => end,
            _ => 0,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::Ranges;

    #[test]
    fn ranges_merge_in_any_order() {
        let mut r = Ranges::default();
        r.add(10, 20);
        assert_eq!((r.total(), r.prefix()), (10, 0));
        r.add(30, 40);
        r.add(15, 32); // bridges both
        assert_eq!(r.0, vec![(10, 40)]);
        r.add(0, 5);
        r.add(5, 10); // touching ranges merge
        assert_eq!(r.0, vec![(0, 40)]);
        assert_eq!((r.total(), r.prefix()), (40, 40));
        r.add(0, 40); // written again: counted once
        r.add(50, 50); // empty
        assert_eq!((r.total(), r.0.len()), (40, 1));
        r.add(45, 50);
        r.add(41, 44);
        assert_eq!(r.0, vec![(0, 40), (41, 44), (45, 50)]);
    }
}
