//! The node-local object store (docs/ARCHITECTURE.md, "Objects").
//!
//! Each worker holds one [`ObjectStore`]: the bytes of the objects this node holds a copy of,
//! one file per object in a directory of its own on tmpfs, written once, sealed read-only and
//! memory-mapped by readers, so that a reader on this node (the worker itself, a task, a
//! Python interpreter) reads an object with no copy. The store itself knows nothing of the
//! wire, the head or namespaces: the data plane (`Objects.Fetch` and `Push`, the fetcher; the
//! end of the layout below), `put` and the head's object table are built on its API.
//!
//! # Writing: create, write, seal
//!
//! ```no_run
//! # fn demo(data: &[u8]) -> Result<(), escher_worker::objects::ObjectError> {
//! use escher_worker::objects::{ObjectId, ObjectStore, StoreConfig};
//! let store = ObjectStore::open(StoreConfig::default())?;
//! let id = ObjectId(42, 0); // (task or session, index)
//! let mut writer = store.create(id, data.len() as u64)?; // room is made here
//! writer.append(data)?; // or write_at(offset, chunk), chunks in any order
//! writer.seal(crc32c::crc32c(data))?; // checked whole, read-only, visible
//! let view = store.get(id)?; // mapped, pinned
//! assert_eq!(view.as_slice(), data);
//! # Ok(()) }
//! ```
//!
//! - [`ObjectStore::create`]`(id, size)` reserves `size` bytes of the store's capacity (making
//!   room first, below) and of the memory directory's filesystem (`fallocate`), and returns an
//!   [`ObjectWriter`] over a hidden file. Nothing is visible yet.
//!   [`ObjectStore::create_streamed`] does the same for a copy that streams in (a fetch, a
//!   push) without the `fallocate`: the filesystem's room is checked instead, beside what the
//!   store's other streamed writers have still to write.
//! - [`ObjectWriter::write_at`] writes a chunk at an offset (a fetch's chunks, in any order,
//!   ranges written again counted once); [`ObjectWriter::append`] writes after what was written
//!   from the start.
//! - [`ObjectWriter::seal`]`(crc32c)` checks that every byte was written and that the CRC-32C of
//!   the whole object is the caller's (the checksum the head's table holds for a fetched copy,
//!   the one the client computed for a put), makes the file read-only (0444) and renames it to
//!   its visible name. So **an object is never visible before it is whole and checked**.
//! - A refused seal, [`ObjectWriter::abort`], or a writer dropped unsealed (a fetch whose
//!   holder went away) removes the file and gives back the reservation.
//!
//! # Reading: views and pins
//!
//! [`ObjectStore::get`]`(id)` maps the sealed file read-only and returns an [`ObjectView`]:
//! [`ObjectView::as_slice`] and [`ObjectView::bytes`] ([`bytes::Bytes`] over the mapping, for a
//! gRPC response or a task's argument) are the file's pages, with no copy. A view **pins** its
//! object: while the view or any `Bytes` from it lives, the object is neither spilled, moved nor
//! unlinked. So [`ObjectView::path`] is a file that a reader on this node may open and map
//! itself for as long as the worker keeps the view; for a process of another user (tasks run as
//! their namespace's user), the worker opens the file and hands over the descriptor, since the
//! store's directories are the worker's own (0700).
//!
//! # Capacity and spilling
//!
//! The capacity ([`StoreConfig::capacity`], `--object-store-memory`; default
//! [`default_capacity`]: 30% of the node's memory, as Ray's) bounds the bytes in memory: sealed
//! objects in the memory directory plus the reservations of writers. When a `create` would pass
//! it, the least recently used (sealed or read) unpinned objects move to the spill directory on
//! disk until the new one fits. A `create` is refused, naming the object and changing nothing,
//! when spilling every unpinned object would not make room ([`ObjectError::TooLarge`]: an
//! object larger than the capacity, or a store full of pinned objects), when the spill disk
//! cannot take what would have to be spilled ([`ObjectError::SpillDiskFull`]), or when the
//! memory directory's filesystem is full ([`ObjectError::MemoryDirFull`]: a `/dev/shm` smaller
//! than the capacity, as a container's 64 MiB default).
//!
//! A `get` of a spilled object **restores** it to memory (spilling colder ones) when room can
//! be made; when it cannot (everything else pinned, or tmpfs full) it maps the object **from
//! its spill file where it lies**, still with no copy (the disk's page cache), and the object
//! stays spilled. Either way the `get` succeeds.
//!
//! # Deleting, closing, and dead workers' stores
//!
//! [`ObjectStore::delete`] (the owner released the object) makes it invisible at once and
//! unlinks its file, or, while a view pins it, when the last view goes (its bytes still count
//! in [`StoreUsage::memory_bytes`] until then). The same id may be stored again meanwhile: each
//! stored copy has a file of its own (`OWNER.INDEX.KEY`). When the store and every writer and
//! view of it are dropped, its two directories are removed with everything in them. A worker
//! that dies without that (SIGKILL) leaves them: [`ObjectStore::open`] first removes the
//! directories of stores whose worker process is dead (`sweep.rs`), as the worker does for
//! task cgroups.
//!
//! [`ObjectStore::usage`] (bytes in memory, being written, spilled, pinned; object counts) and
//! [`ObjectStore::list`] (each object: id, size, checksum, spilled, pins) are what
//! `escher objects` and `/metrics` show.
//!
//! # Concurrency and cost
//!
//! The store is `Clone` and shared between threads; one mutex guards its table. Writing and
//! mapping happen outside it; a seal's rename, a spill or a restore (a copy between tmpfs and
//! disk), and an unlink happen under it, so a `create` that spills holds up other calls for
//! the time of the copy. Every call does blocking file I/O: from async code, call it in
//! `spawn_blocking`. Only the worker's own process writes the directories.
//!
//! # Layout
//!
//! - [`ObjectId`] (`id.rs`): `(owner, index)`, defined in `escher-proto`.
//! - [`ObjectStore`], [`StoreConfig`], [`StoreUsage`], [`ObjectInfo`], [`ObjectStatus`]
//!   (`store.rs`): the directories, create, get, delete, spill and restore.
//! - `table.rs`: the bookkeeping with no I/O (where each copy is, pins, LRU, byte counts), with
//!   its `sanity_check`.
//! - [`ObjectWriter`] (`writer.rs`): one object being written; [`ObjectView`] (`view.rs`): one
//!   mapped, pinned object (the module's only unsafe code, the `mmap`).
//! - `capacity.rs`: [`default_capacity`]; `sweep.rs`: dead workers' stores.
//! - [`ObjectError`] (`error.rs`).
//!
//! The data plane, on top of the store (the only part that speaks the wire):
//! - [`NodeObjects`] (`node.rs`): the store and the namespace each copy was sealed for.
//! - [`ObjectService`] (`service.rs`): the `Objects` service (`Fetch`, `Push`, `Handover`,
//!   `Map`) on
//!   the worker's data-plane listener, checking object tickets; `handover.rs`: a put from a
//!   client on this machine taken as the sealed memfd it wrote the object into; `lend.rs`
//!   (`Map`): an object's sealed file lent to a reader on this machine to map, pinned while
//!   the reader holds the answer open.
//! - [`fetch_object`] (`fetch.rs`): a copy from the holders into this store, trying the next
//!   holder when one fails mid-transfer.

pub(crate) mod args;
mod capacity;
mod error;
mod fetch;
mod handover;
mod id;
mod lend;
mod node;
pub(crate) mod result;
mod service;
mod store;
mod sweep;
mod table;
mod view;
mod writer;

#[cfg(test)]
mod tests;
#[cfg(test)]
mod transfer_tests;

pub use capacity::{DEFAULT_MEMORY_PERCENT, FALLBACK_CAPACITY, default_capacity, node_memory};
pub use error::ObjectError;
pub use fetch::{FetchError, Holder, HolderFailure, fetch_object};
pub use id::{ObjectId, ParseObjectIdError};
pub use node::NodeObjects;
pub use service::{LendStream, ObjectService, ObjectsPlane};
pub use store::{
    DEFAULT_MEMORY_ROOT, DEFAULT_SPILL_ROOT, ObjectInfo, ObjectStatus, ObjectStore, StoreConfig,
    StoreUsage,
};
pub use view::ObjectView;
pub use writer::ObjectWriter;
