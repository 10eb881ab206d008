//! A put to a worker on this machine, handed over as a sealed file instead of streamed
//! (`Objects.Handover`; docs/ARCHITECTURE.md "Objects", "How a put flows").
//!
//! When the worker the head placed an object on listens on a loopback address, the client
//! writes the object's bytes once into a memfd named for the object and its write ticket
//! ([`handover_name`]), seals it against writes and size changes, and names it to the worker
//! by this process's pid and the descriptor's number. The worker opens it through `/proc`,
//! checks it, and copies it into its store, summing the bytes as it goes; its reply is a
//! push's (the size and CRC-32C it sealed). Where the worker cannot take the file (another
//! user's process it may not open, another machine, another PID namespace), it refuses with
//! FAILED_PRECONDITION before storing anything, and the client pushes the bytes over the data
//! plane as before. Each outcome is a debug line of the client's log.
//!
//! `ESCHER_PUT_HANDOVER=off` (or `0`, `false`) in the client's environment turns handing over
//! off: every put streams.

use std::fs::File;
use std::io::Write as _;
use std::net::SocketAddr;
use std::sync::OnceLock;

use escher_proto::transfer::handover_name;
use escher_proto::types::ObjectId;
use escher_proto::wire;

use super::transfer::{ObjectTransferError, connect};

/// The environment variable that turns handing over off (`off`, `0`, `false`).
pub const HANDOVER_ENV: &str = "ESCHER_PUT_HANDOVER";

/// Whether a put to the worker at `address` (`HOST:PORT`) may be handed over: the worker
/// listens on loopback (so it runs on this machine) and handing over is not turned off.
pub(crate) fn may_hand_over(address: &str) -> bool {
    if !cfg!(target_os = "linux") {
        return false;
    }
    let off = std::env::var(HANDOVER_ENV)
        .map(|v| matches!(v.trim(), "off" | "0" | "false"))
        .unwrap_or(false);
    if off {
        return false;
    }
    is_loopback(address)
}

/// Whether `address` (`HOST:PORT`) is on loopback: a worker of this machine.
pub(crate) fn is_loopback(address: &str) -> bool {
    if !cfg!(target_os = "linux") {
        return false;
    }
    match address.parse::<SocketAddr>() {
        Ok(addr) => addr.ip().is_loopback(),
        Err(_) => address
            .rsplit_once(':')
            .is_some_and(|(host, _)| host.eq_ignore_ascii_case("localhost")),
    }
}

/// The memfd name for a put of `id` with write ticket `ticket`, if it may be handed over to
/// the worker at `address`.
pub(crate) fn name_for(address: &str, ticket: &str, id: ObjectId) -> Option<String> {
    may_hand_over(address)
        .then(|| handover_name(ticket, id))
        .flatten()
}

/// This machine's boot id (`/proc/sys/kernel/random/boot_id`), which the worker compares
/// with its own.
pub(crate) fn boot_id() -> &'static str {
    static BOOT_ID: OnceLock<String> = OnceLock::new();
    BOOT_ID.get_or_init(|| {
        std::fs::read_to_string("/proc/sys/kernel/random/boot_id")
            .map(|s| s.trim().to_string())
            .unwrap_or_default()
    })
}

/// A new memfd named `name` holding `data`, sealed against writes, growing and shrinking
/// (and further seals), ready to be handed over.
#[cfg(target_os = "linux")]
pub(crate) fn sealed_memfd(name: &str, data: &[u8]) -> std::io::Result<File> {
    let mut file = new_memfd(name)?;
    file.write_all(data)?;
    seal(&file)?;
    Ok(file)
}

/// A new, empty memfd named `name`, which may be sealed (`MFD_ALLOW_SEALING`).
#[cfg(target_os = "linux")]
pub fn new_memfd(name: &str) -> std::io::Result<File> {
    use nix::sys::memfd::{MFdFlags, memfd_create};
    let fd = memfd_create(name, MFdFlags::MFD_CLOEXEC | MFdFlags::MFD_ALLOW_SEALING)?;
    Ok(File::from(fd))
}

/// Seals `file` (a memfd) against writes, growing, shrinking and further seals.
#[cfg(target_os = "linux")]
pub fn seal(file: &File) -> std::io::Result<()> {
    use nix::fcntl::{FcntlArg, SealFlag, fcntl};
    let seals = SealFlag::F_SEAL_WRITE
        | SealFlag::F_SEAL_GROW
        | SealFlag::F_SEAL_SHRINK
        | SealFlag::F_SEAL_SEAL;
    fcntl(file, FcntlArg::F_ADD_SEALS(seals))?;
    Ok(())
}

/// Hands object `id`'s sealed memfd `file` (`size` bytes) over to the worker whose data plane
/// is at `address`, with `ticket` (write access). `crc32c`, when the caller computed one, is
/// what the worker checks the file against. Returns the size and CRC-32C the worker sealed.
#[cfg(target_os = "linux")]
pub(crate) async fn hand_over(
    address: &str,
    ticket: &str,
    id: ObjectId,
    file: &File,
    size: u64,
    crc32c: Option<u32>,
) -> Result<wire::PushReply, ObjectTransferError> {
    use std::os::fd::AsRawFd as _;
    let mut rpc = connect(id, address).await?;
    let request = wire::HandoverRequest {
        ticket: ticket.to_string(),
        owner: id.owner(),
        index: id.index(),
        pid: std::process::id(),
        fd: file.as_raw_fd(),
        size,
        boot_id: boot_id().to_string(),
        crc32c: crc32c.unwrap_or(0),
        has_crc32c: crc32c.is_some(),
    };
    let reply = rpc
        .handover(request)
        .await
        .map_err(|status| ObjectTransferError::Refused {
            id,
            address: address.to_string(),
            status,
        })?
        .into_inner();
    if reply.size != size || crc32c.is_some_and(|c| c != reply.crc32c) {
        return Err(ObjectTransferError::Stream {
            address: address.to_string(),
            source: escher_proto::transfer::TransferError::Corrupt {
                id,
                size,
                expected: crc32c.unwrap_or(reply.crc32c),
                actual: reply.crc32c,
            },
        });
    }
    Ok(reply)
}

/// Whether a refusal of a handover means the worker could not take the file (then the bytes
/// are pushed instead): FAILED_PRECONDITION, or a worker without the call.
pub(crate) fn is_unusable(err: &ObjectTransferError) -> bool {
    matches!(
        err.code(),
        Some(tonic::Code::FailedPrecondition | tonic::Code::Unimplemented)
    )
}
