//! [`ObjectStore`]: this node's objects, in files on tmpfs, spilled to disk past a capacity.
//!
//! The store owns two directories of its own, made at [`ObjectStore::open`] and removed with
//! everything in them when the store and every writer and view of it are dropped: the memory
//! directory (`<memory root>/escher-objects-PID-N`, `/dev/shm` by default) and the spill
//! directory (`<spill root>/escher-spill-PID-N`, `/var/tmp` by default). One [`Table`] behind
//! one mutex says what is where; file operations that change what is visible (a seal's rename,
//! a spill, a restore, an unlink) happen under it, so the table and the directories agree.
//! Writing an object's bytes and mapping them happen outside it.

use std::fmt;
use std::fs;
use std::io;
use std::os::unix::fs::{DirBuilderExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use super::table::{Key, Place, Table};
use super::writer::Room;
use super::{ObjectError, ObjectId, ObjectView, ObjectWriter, capacity, sweep};

/// Where the memory directory goes unless configured: POSIX shared memory, a tmpfs.
pub const DEFAULT_MEMORY_ROOT: &str = "/dev/shm";
/// Where the spill directory goes unless configured: `/var/tmp`, a disk on every FHS system
/// (`/tmp` is a tmpfs on some, where spilling would free no memory).
pub const DEFAULT_SPILL_ROOT: &str = "/var/tmp";

/// How a store is set up.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StoreConfig {
    /// The most bytes of objects held in memory (`--object-store-memory`): sealed objects in
    /// the memory directory plus those being written. Default [`capacity::default_capacity`].
    pub capacity: u64,
    /// The directory the store's memory directory is made in: a tmpfs, so that objects live
    /// in memory and readers map them with no copy. Default [`DEFAULT_MEMORY_ROOT`].
    pub memory_root: PathBuf,
    /// The directory the store's spill directory is made in: a disk. Default
    /// [`DEFAULT_SPILL_ROOT`].
    pub spill_root: PathBuf,
}

impl Default for StoreConfig {
    fn default() -> Self {
        StoreConfig {
            capacity: capacity::default_capacity(),
            memory_root: PathBuf::from(DEFAULT_MEMORY_ROOT),
            spill_root: PathBuf::from(DEFAULT_SPILL_ROOT),
        }
    }
}

/// A sealed object's identity.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ObjectInfo {
    /// The object.
    pub id: ObjectId,
    /// Its size in bytes.
    pub size: u64,
    /// The CRC-32C of its bytes.
    pub crc32c: u32,
}

/// One stored object as [`ObjectStore::list`] shows it (for `escher objects`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ObjectStatus {
    /// Its id, size and checksum.
    pub info: ObjectInfo,
    /// Whether it lies in the spill directory rather than in memory.
    pub spilled: bool,
    /// How many views (and [`bytes::Bytes`] of them) pin it.
    pub pins: u32,
}

/// What a store holds, for `escher objects` and `/metrics`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct StoreUsage {
    /// The store's capacity in memory.
    pub capacity: u64,
    /// Bytes of sealed objects in memory, including deleted ones still pinned by a reader.
    pub memory_bytes: u64,
    /// Bytes reserved in memory by objects being written. `memory_bytes + writing_bytes`
    /// never exceeds `capacity`.
    pub writing_bytes: u64,
    /// Bytes of objects in the spill directory.
    pub spilled_bytes: u64,
    /// Bytes of objects pinned by a view, wherever they lie.
    pub pinned_bytes: u64,
    /// Sealed objects that can be read (deleted ones are not counted).
    pub objects: u64,
    /// How many of them lie in the spill directory.
    pub spilled_objects: u64,
    /// How many of them are pinned.
    pub pinned_objects: u64,
}

/// This node's object store: cheap to clone (one store, shared), safe to use from any thread.
/// Its calls do blocking file I/O: from async code, call them in `spawn_blocking`.
#[derive(Clone)]
pub struct ObjectStore {
    inner: Arc<Inner>,
}

/// The store itself, shared by the handles, the writers and the pins.
pub(super) struct Inner {
    memory_dir: PathBuf,
    spill_dir: PathBuf,
    capacity: u64,
    table: Mutex<Table>,
    /// Bytes that streamed writers ([`ObjectStore::create_streamed`]) were promised in the
    /// memory directory's filesystem and have not written yet.
    promised: AtomicU64,
}

/// One pin of a stored copy: unpinned when dropped, which unlinks a copy deleted meanwhile.
pub(super) struct Pin {
    inner: Arc<Inner>,
    key: Key,
}

impl Drop for Pin {
    fn drop(&mut self) {
        let gone = self.inner.lock().unpin(self.key);
        if let Some(entry) = gone {
            self.inner.unlink(entry.id, self.key, entry.place);
        }
    }
}

impl ObjectStore {
    /// Opens a new, empty store: removes what stores of dead worker processes left in the
    /// two roots, then makes this one's directories.
    pub fn open(config: StoreConfig) -> Result<ObjectStore, ObjectError> {
        static STORES: AtomicU64 = AtomicU64::new(0);
        let n = STORES.fetch_add(1, Ordering::Relaxed);
        let pid = crate::pidns::host_pid();
        let memory_dir = own_dir(&config.memory_root, sweep::MEMORY_PREFIX, pid, n)?;
        let spill_dir = match own_dir(&config.spill_root, sweep::SPILL_PREFIX, pid, n) {
            Ok(dir) => dir,
            Err(e) => {
                let _ = fs::remove_dir_all(&memory_dir);
                return Err(e);
            }
        };
        if let Some(room) = fs_size(&config.memory_root)
            && room < config.capacity
        {
            tracing::warn!(
                root = %config.memory_root.display(),
                capacity = config.capacity,
                filesystem = room,
                "the object store's capacity is larger than the filesystem that holds it: objects \
                 past its size will be refused; lower --object-store-memory or enlarge it"
            );
        }
        tracing::debug!(memory = %memory_dir.display(), spill = %spill_dir.display(), capacity = config.capacity, "object store opened");
        Ok(ObjectStore {
            inner: Arc::new(Inner {
                memory_dir,
                spill_dir,
                capacity: config.capacity,
                table: Mutex::default(),
                promised: AtomicU64::new(0),
            }),
        })
    }

    /// Starts writing object `id` of `size` bytes, spilling cold objects first if it would
    /// not fit otherwise. The object is invisible until [`ObjectWriter::seal`]; dropping the
    /// writer unsealed removes it.
    ///
    /// Refused, with nothing changed, when `id` is stored or being written already
    /// ([`ObjectError::Exists`]), when spilling every unpinned object would not make room
    /// ([`ObjectError::TooLarge`]), when the spill disk cannot take what must be spilled
    /// ([`ObjectError::SpillDiskFull`]), and when the memory directory's filesystem is full
    /// ([`ObjectError::MemoryDirFull`]).
    pub fn create(&self, id: ObjectId, size: u64) -> Result<ObjectWriter, ObjectError> {
        let key = self.reserve(id, size)?;
        ObjectWriter::start(Arc::clone(&self.inner), id, size, key, Room::Allocated)
    }

    /// [`create`](Self::create) for a copy that arrives from the network (a fetch, a push),
    /// whose bytes are written as fast as they come: the memory directory's filesystem is not
    /// asked to allocate the object up front (`fallocate` zeroes every page, a third of the
    /// cost of writing the copy), but must have room for it beside what the store's other
    /// streamed writers have still to write (`statvfs`), else [`ObjectError::MemoryDirFull`]
    /// here as with `create`. Should the filesystem still fill meanwhile (another process
    /// writing to it), the write that finds no room fails with `MemoryDirFull` and the copy,
    /// never sealed, is removed.
    pub fn create_streamed(&self, id: ObjectId, size: u64) -> Result<ObjectWriter, ObjectError> {
        let key = self.reserve(id, size)?;
        ObjectWriter::start(Arc::clone(&self.inner), id, size, key, Room::Checked)
    }

    /// Reserves `size` bytes of the capacity for `id`, spilling colder objects if need be.
    fn reserve(&self, id: ObjectId, size: u64) -> Result<Key, ObjectError> {
        let mut table = self.inner.lock();
        let victims = table.plan_room(id, size, self.inner.capacity)?;
        self.inner.spill(&mut table, id, size, &victims)?;
        Ok(table.reserve(id, size))
    }

    /// Maps sealed object `id` and pins it while the view (or any of its [`bytes::Bytes`])
    /// lives. A spilled object is restored to memory, spilling colder ones, when that can make
    /// room; otherwise (every other object pinned, or the memory directory full) it is mapped
    /// from its spill file where it lies, still with no copy, and stays spilled.
    pub fn get(&self, id: ObjectId) -> Result<ObjectView, ObjectError> {
        let (key, size, crc32c, sums, place) = {
            let mut table = self.inner.lock();
            let (key, entry) = table.pin(id).ok_or(ObjectError::NotFound { id })?;
            let (size, crc32c, sums, mut place) =
                (entry.size, entry.crc32c, entry.sums.clone(), entry.place);
            if place == Place::Spilled {
                match self.inner.restore(&mut table, key, id, size) {
                    Ok(()) => place = Place::Memory,
                    Err(e) => tracing::debug!(object = %id, %e, "read where it was spilled"),
                }
            }
            (key, size, crc32c, sums, place)
        };
        // Pinned: from here on the file stays where it is, and the pin's drop unpins it.
        let pin = Arc::new(Pin {
            inner: Arc::clone(&self.inner),
            key,
        });
        ObjectView::map(id, size, crc32c, sums, self.inner.path(id, key, place), pin)
    }

    /// Deletes object `id` (its owner released it). It is invisible at once; its file goes
    /// now, or when the last view of it is dropped. [`ObjectError::NotFound`] when there is
    /// no such sealed object (an object being written is dropped by dropping its writer).
    pub fn delete(&self, id: ObjectId) -> Result<(), ObjectError> {
        let gone = self.inner.lock().release(id)?;
        if let Some((key, entry)) = gone {
            self.inner.unlink(id, key, entry.place);
        }
        Ok(())
    }

    /// Deletes object `id` as [`ObjectStore::delete`] does, but only if its visible copy is
    /// still copy `copy` (as [`ObjectStore::copies`] numbered it): a copy stored again since
    /// (a task's result written anew) is another and stays. Whether it was deleted.
    pub fn delete_copy(&self, id: ObjectId, copy: u64) -> Result<bool, ObjectError> {
        let gone = {
            let mut table = self.inner.lock();
            if table.lookup(id).map(|(key, _)| key) != Some(copy) {
                return Ok(false);
            }
            table.release(id)?
        };
        if let Some((key, entry)) = gone {
            self.inner.unlink(id, key, entry.place);
        }
        Ok(true)
    }

    /// Every sealed object, in id order, with the store's number for its copy (another for a
    /// copy stored again under the same id): what a worker reports to the head after it
    /// attaches.
    pub fn copies(&self) -> Vec<(ObjectInfo, u64)> {
        let table = self.inner.lock();
        table
            .visible()
            .map(|(key, e)| {
                let info = ObjectInfo {
                    id: e.id,
                    size: e.size,
                    crc32c: e.crc32c,
                };
                (info, key)
            })
            .collect()
    }

    /// Whether sealed object `id` is here.
    pub fn contains(&self, id: ObjectId) -> bool {
        self.inner.lock().lookup(id).is_some()
    }

    /// Whether object `id` is being written (created, not yet sealed nor dropped).
    pub fn is_writing(&self, id: ObjectId) -> bool {
        self.inner.lock().writing().contains_key(&id)
    }

    /// Sealed object `id`'s size and checksum.
    pub fn info(&self, id: ObjectId) -> Option<ObjectInfo> {
        let table = self.inner.lock();
        table.lookup(id).map(|(_, e)| ObjectInfo {
            id,
            size: e.size,
            crc32c: e.crc32c,
        })
    }

    /// Every sealed object, in id order.
    pub fn list(&self) -> Vec<ObjectStatus> {
        let table = self.inner.lock();
        table
            .visible()
            .map(|(_, e)| ObjectStatus {
                info: ObjectInfo {
                    id: e.id,
                    size: e.size,
                    crc32c: e.crc32c,
                },
                spilled: e.place == Place::Spilled,
                pins: e.pins,
            })
            .collect()
    }

    /// What the store holds now.
    pub fn usage(&self) -> StoreUsage {
        let table = self.inner.lock();
        let (memory_bytes, spilled_bytes, writing_bytes) = table.bytes();
        let mut usage = StoreUsage {
            capacity: self.inner.capacity,
            memory_bytes,
            writing_bytes,
            spilled_bytes,
            pinned_bytes: table
                .copies()
                .filter(|(_, e)| e.pins > 0)
                .map(|(_, e)| e.size)
                .sum(),
            ..StoreUsage::default()
        };
        for (_, e) in table.visible() {
            usage.objects += 1;
            usage.spilled_objects += u64::from(e.place == Place::Spilled);
            usage.pinned_objects += u64::from(e.pins > 0);
        }
        usage
    }

    /// The store's capacity in memory.
    pub fn capacity(&self) -> u64 {
        self.inner.capacity
    }

    /// The store's memory directory (on tmpfs).
    pub fn memory_dir(&self) -> &Path {
        &self.inner.memory_dir
    }

    /// The store's spill directory (on disk).
    pub fn spill_dir(&self) -> &Path {
        &self.inner.spill_dir
    }

    /// Checks the table's invariants and that the two directories hold exactly its files.
    #[cfg(test)]
    pub(super) fn sanity_check(&self) -> Result<(), String> {
        let table = self.inner.lock();
        table.sanity_check()?;
        let (memory, _, reserved) = table.bytes();
        if memory + reserved > self.inner.capacity {
            return Err(format!(
                "{memory} + {reserved} bytes in memory, over {}",
                self.inner.capacity
            ));
        }
        let mut want_memory = std::collections::BTreeSet::new();
        let mut want_spill = std::collections::BTreeSet::new();
        for (key, e) in table.copies() {
            let name = file_name(e.id, key);
            match e.place {
                Place::Memory => want_memory.insert(name),
                Place::Spilled => want_spill.insert(name),
            };
        }
        let names = |dir: &Path| -> Result<std::collections::BTreeSet<String>, String> {
            let entries = fs::read_dir(dir).map_err(|e| format!("{}: {e}", dir.display()))?;
            Ok(entries
                .flatten()
                .filter_map(|e| e.file_name().into_string().ok())
                .filter(|n| !n.starts_with('.'))
                .collect())
        };
        let parts = names_with_dot(&self.inner.memory_dir)?;
        if parts.len() != table.writing().len() {
            return Err(format!(
                "{} partial files for {} writers",
                parts.len(),
                table.writing().len()
            ));
        }
        if names(&self.inner.memory_dir)? != want_memory {
            return Err(format!(
                "memory directory holds {:?}, not {want_memory:?}",
                names(&self.inner.memory_dir)?
            ));
        }
        if names(&self.inner.spill_dir)? != want_spill
            || !names_with_dot(&self.inner.spill_dir)?.is_empty()
        {
            return Err(format!(
                "spill directory holds {:?}, not {want_spill:?}",
                names(&self.inner.spill_dir)?
            ));
        }
        Ok(())
    }
}

/// The names of the hidden (partial) files in `dir`.
#[cfg(test)]
fn names_with_dot(dir: &Path) -> Result<Vec<String>, String> {
    let entries = fs::read_dir(dir).map_err(|e| format!("{}: {e}", dir.display()))?;
    Ok(entries
        .flatten()
        .filter_map(|e| e.file_name().into_string().ok())
        .filter(|n| n.starts_with('.'))
        .collect())
}

impl Inner {
    pub(super) fn lock(&self) -> MutexGuard<'_, Table> {
        // A panic under the lock leaves no half-done change behind (each is one table call
        // after its file operation), so a poisoned table is still a true one.
        self.table.lock().unwrap_or_else(PoisonError::into_inner)
    }

    pub(super) fn memory_dir(&self) -> &Path {
        &self.memory_dir
    }

    /// The file of copy `key` of `id` where it lies.
    pub(super) fn path(&self, id: ObjectId, key: Key, place: Place) -> PathBuf {
        let dir = match place {
            Place::Memory => &self.memory_dir,
            Place::Spilled => &self.spill_dir,
        };
        dir.join(file_name(id, key))
    }

    /// Makes a writer's file visible as copy `key` of `id`.
    pub(super) fn seal(
        &self,
        partial: &Path,
        key: Key,
        id: ObjectId,
        size: u64,
        crc32c: u32,
        sums: Option<Arc<[u32]>>,
    ) -> Result<(), ObjectError> {
        let mut table = self.lock();
        let path = self.path(id, key, Place::Memory);
        fs::rename(partial, &path)
            .map_err(|e| ObjectError::io(format!("seal object {id} as"), &path, e))?;
        table.seal(key, id, size, crc32c, sums);
        Ok(())
    }

    /// Forgets a writer that was not sealed (its file is removed by the writer).
    pub(super) fn abandon(&self, id: ObjectId) {
        self.lock().unreserve(id);
    }

    /// Promises `size` bytes of the memory directory's filesystem to a streamed writer of
    /// `id`, when it has that much free beside what earlier promises have still to take.
    pub(super) fn promise(&self, id: ObjectId, size: u64) -> Result<(), ObjectError> {
        let before = self.promised.fetch_add(size, Ordering::SeqCst);
        let free = fs_free(&self.memory_dir).unwrap_or(u64::MAX);
        if before.saturating_add(size) > free {
            self.promised.fetch_sub(size, Ordering::SeqCst);
            return Err(ObjectError::MemoryDirFull {
                id,
                size,
                dir: self.memory_dir.clone(),
            });
        }
        Ok(())
    }

    /// Gives back `bytes` of a streamed writer's promise: written (the filesystem's free
    /// space now counts them) or no longer wanted.
    pub(super) fn unpromise(&self, bytes: u64) {
        self.promised.fetch_sub(bytes, Ordering::SeqCst);
    }

    /// Spills `victims` to disk to make room for `size` bytes of `id`, after checking that the
    /// spill disk can take them all.
    fn spill(
        &self,
        table: &mut Table,
        id: ObjectId,
        size: u64,
        victims: &[Key],
    ) -> Result<(), ObjectError> {
        if victims.is_empty() {
            return Ok(());
        }
        let need: u64 = victims
            .iter()
            .filter_map(|k| table.entry(*k))
            .map(|e| e.size)
            .sum();
        let available = fs_free(&self.spill_dir).unwrap_or(u64::MAX);
        if need > available {
            return Err(ObjectError::SpillDiskFull {
                id,
                size,
                need,
                available,
                dir: self.spill_dir.clone(),
            });
        }
        for &key in victims {
            let Some(victim) = table.entry(key).map(|e| e.id) else {
                continue;
            };
            let from = self.path(victim, key, Place::Memory);
            let to = self.path(victim, key, Place::Spilled);
            move_file(&from, &self.spill_dir, &to)
                .map_err(|e| ObjectError::io(format!("spill object {victim} to"), &to, e))?;
            table.set_place(key, Place::Spilled);
            tracing::debug!(object = %victim, for_object = %id, "spilled");
        }
        Ok(())
    }

    /// Moves pinned copy `key` of `id` back from the spill disk to memory, spilling colder
    /// copies if that makes room.
    fn restore(
        &self,
        table: &mut Table,
        key: Key,
        id: ObjectId,
        size: u64,
    ) -> Result<(), ObjectError> {
        let victims = table.victims(id, size, self.capacity)?;
        self.spill(table, id, size, &victims)?;
        let from = self.path(id, key, Place::Spilled);
        let to = self.path(id, key, Place::Memory);
        move_file(&from, &self.memory_dir, &to).map_err(|e| {
            if e.raw_os_error() == Some(nix::libc::ENOSPC) {
                ObjectError::MemoryDirFull {
                    id,
                    size,
                    dir: self.memory_dir.clone(),
                }
            } else {
                ObjectError::io(format!("restore object {id} to"), &to, e)
            }
        })?;
        table.set_place(key, Place::Memory);
        tracing::debug!(object = %id, "restored from the spill disk");
        Ok(())
    }

    /// Removes copy `key` of `id`'s file.
    fn unlink(&self, id: ObjectId, key: Key, place: Place) {
        let path = self.path(id, key, place);
        if let Err(e) = fs::remove_file(&path)
            && e.kind() != io::ErrorKind::NotFound
        {
            tracing::warn!(object = %id, path = %path.display(), %e, "cannot remove a deleted object's file");
        }
    }
}

impl Drop for Inner {
    fn drop(&mut self) {
        let copies = self
            .table
            .get_mut()
            .unwrap_or_else(PoisonError::into_inner)
            .drain();
        for dir in [&self.memory_dir, &self.spill_dir] {
            if let Err(e) = fs::remove_dir_all(dir)
                && e.kind() != io::ErrorKind::NotFound
            {
                tracing::warn!(dir = %dir.display(), %e, "cannot remove the object store's directory");
            }
        }
        tracing::debug!(objects = copies.len(), memory = %self.memory_dir.display(), "object store closed");
    }
}

impl fmt::Debug for ObjectStore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ObjectStore")
            .field("memory_dir", &self.inner.memory_dir)
            .field("spill_dir", &self.inner.spill_dir)
            .field("capacity", &self.inner.capacity)
            .finish_non_exhaustive()
    }
}

impl fmt::Debug for Pin {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Pin").field("key", &self.key).finish()
    }
}

/// The name of copy `key` of `id`: `OWNER.INDEX.KEY`, the same in both directories.
fn file_name(id: ObjectId, key: Key) -> String {
    format!("{}.{}.{key}", id.owner(), id.index())
}

/// The name of a writer's file before its seal: hidden, and never a sealed file's name.
pub(super) fn partial_name(id: ObjectId, key: Key) -> String {
    format!(".{}.part", file_name(id, key))
}

/// Copies `from` to `to` (in `dir`, another filesystem) through a hidden name, then removes
/// `from`: `to` exists only whole.
fn move_file(from: &Path, dir: &Path, to: &Path) -> io::Result<()> {
    let name = to.file_name().and_then(|n| n.to_str()).unwrap_or("object");
    let partial = dir.join(format!(".{name}.part"));
    let copied = fs::copy(from, &partial).and_then(|_| fs::rename(&partial, to));
    if let Err(e) = copied {
        let _ = fs::remove_file(&partial);
        return Err(e);
    }
    if let Err(e) = fs::remove_file(from) {
        let _ = fs::remove_file(to);
        return Err(e);
    }
    Ok(())
}

/// Makes this store's directory `PREFIXPID-N` in `root`, after sweeping dead stores there.
fn own_dir(root: &Path, prefix: &str, pid: u32, n: u64) -> Result<PathBuf, ObjectError> {
    if !root.is_dir() {
        return Err(ObjectError::io(
            "use",
            root,
            io::Error::new(
                io::ErrorKind::NotFound,
                "not a directory; create it, or configure another",
            ),
        ));
    }
    sweep::sweep_dead_stores(root, prefix);
    let dir = root.join(format!("{prefix}{pid}-{n}"));
    // Only a dead process with this pid (a container's worker restarted) can have left it.
    if dir.exists() {
        fs::remove_dir_all(&dir).map_err(|e| ObjectError::io("remove a stale store", &dir, e))?;
    }
    fs::DirBuilder::new()
        .mode(0o700)
        .create(&dir)
        .map_err(|e| ObjectError::io("create", &dir, e))?;
    let _ = fs::set_permissions(&dir, fs::Permissions::from_mode(0o700));
    Ok(dir)
}

/// The bytes free to an unprivileged writer on `path`'s filesystem.
fn fs_free(path: &Path) -> Option<u64> {
    let stat = nix::sys::statvfs::statvfs(path).ok()?;
    Some(stat.blocks_available() as u64 * stat.fragment_size() as u64)
}

/// The size of `path`'s filesystem.
fn fs_size(path: &Path) -> Option<u64> {
    let stat = nix::sys::statvfs::statvfs(path).ok()?;
    Some(stat.blocks() as u64 * stat.fragment_size() as u64)
}
