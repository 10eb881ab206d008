//! A get from a worker on this machine, read from the holder's own sealed file instead of
//! fetched (`Objects.Map`; docs/ARCHITECTURE.md "Objects", "Same-node reads").
//!
//! The mirror of a put's hand-over (`handover.rs`): when a holder's data plane listens on a
//! loopback address, the client asks it, with the read ticket the head gave for a fetch, to
//! lend the object's file. The worker opens the sealed file of its store and names it by its
//! pid and the descriptor's number, with the file's device, inode and size; the client opens
//! `/proc/PID/fd/FD` (a path first, the file only once it is a regular file), checks that it
//! is that file, and maps it read-only. The bytes are the store's own pages: nothing is
//! copied, and nothing is summed here either (the store sealed the copy whole and checked
//! against the length and CRC-32C the head recorded, and a sealed copy is read-only and
//! never written again; the holder's grant names the same size and checksum).
//!
//! The worker keeps the object pinned (neither spilled, moved nor unlinked) while the answer's
//! stream is open, and the client keeps it open for as long as the mapping lives (an
//! [`ObjectLease`] inside the [`Bytes`], or beside Python's own mapping). Each lease holds a
//! connection to the holder and a descriptor there, so at most [`MAX_LEASES`] live at once in
//! a process; past that, and wherever the file cannot be had (a worker of another user, of
//! another PID namespace or machine, one without the call), the client fetches as before.
//! Each outcome is a debug line of the client's log.
//!
//! `ESCHER_GET_MAP=off` (or `0`, `false`) in the client's environment turns mapping off:
//! every get fetches.
#![allow(unsafe_code)]

use std::fs::File;
use std::os::fd::{AsFd as _, AsRawFd as _};
use std::sync::atomic::{AtomicUsize, Ordering};

use bytes::Bytes;
use escher_proto::data_channel::DataChannel;
use escher_proto::types::ObjectId;
use escher_proto::wire::{self, objects_client::ObjectsClient};
use nix::fcntl::OFlag;
use nix::sys::stat::Mode;

use super::handover::{boot_id, is_loopback};
use super::transfer::connect;

/// The environment variable that turns mapping a holder's file off (`off`, `0`, `false`).
pub const MAP_ENV: &str = "ESCHER_GET_MAP";

/// How many lent files a process maps at once at most (each holds a connection to its holder
/// and a descriptor there); a get past it fetches.
pub const MAX_LEASES: usize = 128;

/// The leases alive in this process.
static LEASES: AtomicUsize = AtomicUsize::new(0);

/// Whether a get from the holder at `address` (`HOST:PORT`) may map its file: the holder
/// listens on loopback (so it runs on this machine) and mapping is not turned off.
pub(crate) fn may_map(address: &str) -> bool {
    let off = std::env::var(MAP_ENV)
        .map(|v| matches!(v.trim(), "off" | "0" | "false"))
        .unwrap_or(false);
    !off && is_loopback(address)
}

/// A holder's promise to keep an object pinned in its store: the open answer of its `Map`
/// call. Dropping it ends the call, and the holder may then spill or delete the object (a
/// mapping made meanwhile keeps its pages, as a mapping of an unlinked file does).
pub struct ObjectLease {
    _stream: tonic::Streaming<wire::MapGrant>,
    _rpc: ObjectsClient<DataChannel>,
}

impl Drop for ObjectLease {
    fn drop(&mut self) {
        LEASES.fetch_sub(1, Ordering::Relaxed);
    }
}

impl std::fmt::Debug for ObjectLease {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("ObjectLease")
    }
}

/// An object's sealed file lent by its holder on this machine, opened read-only here.
#[derive(Debug)]
pub struct LentObject {
    /// The object.
    pub id: ObjectId,
    /// The sealed file (read-only; never written again).
    pub file: File,
    /// Its length in bytes.
    pub size: u64,
    /// What keeps the object pinned at its holder: keep it as long as a mapping of `file`.
    pub lease: ObjectLease,
}

/// The bytes of a mapping and the lease that pins its file.
struct Mapped {
    map: memmap2::Mmap,
    _lease: ObjectLease,
}

impl AsRef<[u8]> for Mapped {
    fn as_ref(&self) -> &[u8] {
        &self.map
    }
}

impl LentObject {
    /// The object's bytes, mapped read-only: the holder's own pages, pinned there as long as
    /// the [`Bytes`] (or any clone of them) live. An empty object is an empty `Bytes`.
    pub fn into_bytes(self) -> std::io::Result<Bytes> {
        if self.size == 0 {
            return Ok(Bytes::new());
        }
        // SAFETY: the file is a sealed copy of the holder's store: complete, read-only (0444)
        // and never written again, and the lease keeps it pinned (neither moved nor truncated)
        // for as long as the mapping, which `Mapped` ties to the lease, lives.
        let map = unsafe { memmap2::Mmap::map(&self.file) }?;
        if map.len() as u64 != self.size {
            return Err(std::io::Error::other(format!(
                "object {}: the lent file maps {} bytes, not {}",
                self.id,
                map.len(),
                self.size
            )));
        }
        Ok(Bytes::from_owner(Mapped {
            map,
            _lease: self.lease,
        }))
    }
}

/// Asks the holder at `address` to lend object `id`'s sealed file, with `ticket` (read
/// access), and opens it. `Err` says why not (the caller then fetches).
pub(crate) async fn lend(address: &str, ticket: &str, id: ObjectId) -> Result<LentObject, String> {
    if LEASES.fetch_add(1, Ordering::Relaxed) >= MAX_LEASES {
        LEASES.fetch_sub(1, Ordering::Relaxed);
        return Err(format!("{MAX_LEASES} lent files are mapped already"));
    }
    // Counted from here: dropped with the lease, or given back below.
    let taken = Taken;
    let mut rpc = connect(id, address).await.map_err(|e| e.to_string())?;
    let request = wire::MapRequest {
        ticket: ticket.to_string(),
        owner: id.owner(),
        index: id.index(),
        boot_id: boot_id().to_string(),
    };
    let mut stream = rpc
        .map(request)
        .await
        .map_err(|s| format!("the holder refused: {}", s.message()))?
        .into_inner();
    let grant = stream
        .message()
        .await
        .map_err(|s| format!("the holder's answer broke off: {}", s.message()))?
        .ok_or("the holder ended its answer before naming the file")?;
    let file = open_granted(&grant)?;
    std::mem::forget(taken);
    Ok(LentObject {
        id,
        file,
        size: grant.size,
        lease: ObjectLease {
            _stream: stream,
            _rpc: rpc,
        },
    })
}

/// Gives back a lease's count when `lend` fails before the lease is made.
struct Taken;

impl Drop for Taken {
    fn drop(&mut self) {
        LEASES.fetch_sub(1, Ordering::Relaxed);
    }
}

/// The holder's descriptor, opened read-only, once it is found to be a regular file with the
/// device, inode and size the grant names.
fn open_granted(grant: &wire::MapGrant) -> Result<File, String> {
    let path = format!("/proc/{}/fd/{}", grant.pid, grant.fd);
    let unopenable = |e: nix::Error| format!("cannot open the holder's descriptor {path}: {e}");
    // A path only first (which opens nothing: no FIFO to block on, no device to wake), then
    // the file itself, read-only, once it is known to be the regular file the grant names.
    let handle = nix::fcntl::open(
        path.as_str(),
        OFlag::O_PATH | OFlag::O_CLOEXEC,
        Mode::empty(),
    )
    .map_err(unopenable)?;
    // `dev_t`, `ino_t` and `off_t` are not `u64` on every target.
    #[allow(clippy::unnecessary_cast)]
    let is_granted = |st: &nix::sys::stat::FileStat| {
        st.st_mode & nix::libc::S_IFMT == nix::libc::S_IFREG
            && st.st_dev as u64 == grant.device
            && st.st_ino as u64 == grant.inode
            && st.st_size as u64 == grant.size
    };
    let stat = nix::sys::stat::fstat(handle.as_fd()).map_err(unopenable)?;
    if !is_granted(&stat) {
        return Err(format!(
            "{path} is not the file the holder named (another PID namespace's process?)"
        ));
    }
    let file = nix::fcntl::open(
        format!("/proc/self/fd/{}", handle.as_raw_fd()).as_str(),
        OFlag::O_RDONLY | OFlag::O_CLOEXEC | OFlag::O_NOCTTY | OFlag::O_NONBLOCK,
        Mode::empty(),
    )
    .map_err(unopenable)?;
    let stat = nix::sys::stat::fstat(file.as_fd()).map_err(unopenable)?;
    if !is_granted(&stat) {
        return Err(format!("{path} changed while it was opened"));
    }
    Ok(File::from(file))
}
