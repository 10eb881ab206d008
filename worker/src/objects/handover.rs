//! `Objects.Handover`: a put from a client on this machine, handed over as a sealed file
//! instead of streamed (docs/ARCHITECTURE.md "Objects", "How a put flows").
//!
//! The client wrote the object's bytes into a memfd named for the object and its write ticket
//! ([`handover_name`]) and sealed it against writes and size changes. The worker opens the
//! client's descriptor through `/proc/PID/fd/FD` (the host's `/proc` when the worker runs in a
//! PID namespace of its own), read-only, and takes it only when the file it opened is that
//! memfd (the name, nonce included), is sealed (`F_SEAL_WRITE`, `F_SEAL_GROW`,
//! `F_SEAL_SHRINK`: its bytes cannot change while they are read, nor after) and has the
//! object's size. Then it maps the memfd (sealed, so its pages cannot change under the
//! mapping) and writes its pages into a new copy of its store ([`ObjectWriter`]), summing
//! them as they go (one copy, the store's `pwrite`), and seals that copy only whole and with the checksum the client
//! computed, when it sent one: as a push does, nothing of a refused handover is kept.
//!
//! Whatever makes the file unusable (a process of another machine or PID namespace, one
//! this worker may not open, a file that is not the memfd or not sealed, another size) is a
//! [`HandoverRefusal`], answered FAILED_PRECONDITION with its text, before anything is
//! stored; the client then pushes the bytes over the data plane as before.
#![allow(unsafe_code)]

use std::fs::File;
use std::io;
use std::os::fd::{AsFd, AsRawFd};
use std::sync::OnceLock;

use nix::fcntl::{FcntlArg, OFlag, SealFlag};

use super::{ObjectError, ObjectId, ObjectInfo, ObjectStore};

/// How many bytes of the mapped memfd a handover sums and writes at a time: small enough to
/// stay in the processor's cache between the sum and the write.
const COPY_CHUNK: usize = 1 << 20;

/// The seals a handed-over file must carry: its bytes and its size are fixed.
const NEEDED_SEALS: [(SealFlag, &str); 3] = [
    (SealFlag::F_SEAL_WRITE, "F_SEAL_WRITE"),
    (SealFlag::F_SEAL_GROW, "F_SEAL_GROW"),
    (SealFlag::F_SEAL_SHRINK, "F_SEAL_SHRINK"),
];

/// What a client says of the file it hands over.
#[derive(Debug, Clone)]
pub(super) struct Handover {
    /// The object.
    pub(super) id: ObjectId,
    /// The client's pid and the memfd's descriptor there.
    pub(super) pid: u32,
    pub(super) fd: i32,
    /// The object's length.
    pub(super) size: u64,
    /// The client's machine (its boot id).
    pub(super) boot_id: String,
    /// The name the memfd must have ([`handover_name`] of the ticket).
    pub(super) name: String,
    /// The checksum the client computed, if it did.
    pub(super) crc32c: Option<u32>,
}

/// Why a handed-over file was not taken (the client then pushes the bytes).
#[derive(Debug, thiserror::Error)]
pub(super) enum HandoverRefusal {
    /// The client runs on another machine.
    #[error("the client runs on another machine (boot id {client:?}, this one's {this:?})")]
    OtherMachine { client: String, this: String },
    /// The descriptor could not be opened.
    #[error(
        "cannot open the client's descriptor /proc/{pid}/fd/{fd}: {cause} (another user's \
         process, another PID namespace, or a descriptor that is gone)"
    )]
    Unopenable { pid: u32, fd: i32, cause: io::Error },
    /// The file is not the memfd made for this object.
    #[error("/proc/{pid}/fd/{fd} is {found:?}, not the memfd {expected:?} made for this put")]
    WrongFile {
        pid: u32,
        fd: i32,
        found: String,
        expected: String,
    },
    /// The file is not sealed as it must be.
    #[error("the memfd {name:?} is not sealed with {missing}: its bytes could still change")]
    NotSealed { name: String, missing: String },
    /// The file is not the object's size.
    #[error("the memfd {name:?} holds {actual} bytes, not the object's {size}")]
    WrongSize {
        name: String,
        size: u64,
        actual: u64,
    },
}

/// Why a handover failed: the file was refused (the client may push instead), or the store
/// refused the copy (as it would a push).
#[derive(Debug)]
pub(super) enum HandoverError {
    Refused(HandoverRefusal),
    Store(ObjectError),
}

impl From<ObjectError> for HandoverError {
    fn from(e: ObjectError) -> Self {
        HandoverError::Store(e)
    }
}

impl From<HandoverRefusal> for HandoverError {
    fn from(e: HandoverRefusal) -> Self {
        HandoverError::Refused(e)
    }
}

/// This machine's boot id (`/proc/sys/kernel/random/boot_id`), empty where there is none.
pub(super) fn boot_id() -> &'static str {
    static BOOT_ID: OnceLock<String> = OnceLock::new();
    BOOT_ID.get_or_init(|| {
        std::fs::read_to_string("/proc/sys/kernel/random/boot_id")
            .map(|s| s.trim().to_string())
            .unwrap_or_default()
    })
}

/// Checks the file `handover` names and copies it into `store` as its object, sealed.
/// Blocking file I/O: call it off the async threads.
pub(super) fn take(store: &ObjectStore, handover: &Handover) -> Result<ObjectInfo, HandoverError> {
    let file = open_checked(handover)?;
    let id = handover.id;
    let mut writer = store.create(id, handover.size)?;
    let (mut offset, mut crc) = (0, 0);
    if handover.size > 0 {
        // The memfd's pages themselves, read where they are: one copy, into the store's file
        // (`pwrite`), rather than a read into a buffer and a write out of it.
        // SAFETY: the file is a memfd sealed against writes, growing and shrinking (checked by
        // `open_checked`): no one can change or truncate it while this mapping lives.
        let map = unsafe { memmap2::MmapOptions::new().populate().map(&file) }
            .map_err(|e| ObjectError::io(format!("map object {id} from"), handover.path(), e))?;
        for piece in map.chunks(COPY_CHUNK) {
            let sum = crc32c::crc32c(piece);
            writer.write_summed(offset, piece, sum)?;
            crc = crc32c::crc32c_combine(crc, sum, piece.len());
            offset += piece.len() as u64;
        }
    }
    // The client's sum, when it sent one, is what the copy must match (a seal refuses another);
    // else the sum of the bytes as read, which the reply gives the client to report.
    Ok(writer.seal(handover.crc32c.unwrap_or(crc))?)
}

impl Handover {
    fn path(&self) -> std::path::PathBuf {
        format!("/proc/{}/fd/{}", self.pid, self.fd).into()
    }
}

/// The client's memfd, opened read-only, once it is found to be the one made for this object,
/// sealed, and of its size.
fn open_checked(h: &Handover) -> Result<File, HandoverRefusal> {
    let this = boot_id();
    if h.boot_id != this || this.is_empty() {
        return Err(HandoverRefusal::OtherMachine {
            client: h.boot_id.clone(),
            this: this.to_string(),
        });
    }
    let unopenable = |cause| HandoverRefusal::Unopenable {
        pid: h.pid,
        fd: h.fd,
        cause,
    };
    let relative = format!("{}/fd/{}", h.pid, h.fd);
    // A path only first (which opens nothing: no FIFO to block on, no device to wake), then
    // the file itself, read-only, once it is known to be a regular file.
    let path = crate::pidns::open_host_proc(&relative, OFlag::O_PATH | OFlag::O_CLOEXEC)
        .map_err(|e| unopenable(e.into()))?;
    let kind = nix::sys::stat::fstat(path.as_fd()).map_err(|e| unopenable(e.into()))?;
    let file = if kind.st_mode & nix::libc::S_IFMT == nix::libc::S_IFREG {
        nix::fcntl::open(
            format!("/proc/self/fd/{}", path.as_raw_fd()).as_str(),
            OFlag::O_RDONLY | OFlag::O_CLOEXEC | OFlag::O_NOCTTY | OFlag::O_NONBLOCK,
            nix::sys::stat::Mode::empty(),
        )
        .map_err(|e| unopenable(e.into()))?
    } else {
        path
    };
    let file = File::from(file);
    // What was opened, not what the path named a moment before: this process's own link.
    let found = std::fs::read_link(format!("/proc/self/fd/{}", file.as_raw_fd()))
        .map(|p| p.display().to_string())
        .map_err(unopenable)?;
    let expected = format!("/memfd:{} (deleted)", h.name);
    if found != expected {
        return Err(HandoverRefusal::WrongFile {
            pid: h.pid,
            fd: h.fd,
            found,
            expected,
        });
    }
    let seals = nix::fcntl::fcntl(file.as_fd(), FcntlArg::F_GET_SEALS)
        .map(SealFlag::from_bits_truncate)
        .unwrap_or(SealFlag::empty());
    let missing: Vec<&str> = NEEDED_SEALS
        .iter()
        .filter(|(seal, _)| !seals.contains(*seal))
        .map(|(_, name)| *name)
        .collect();
    if !missing.is_empty() {
        return Err(HandoverRefusal::NotSealed {
            name: h.name.clone(),
            missing: missing.join(", "),
        });
    }
    let actual = file.metadata().map_err(unopenable)?.len();
    if actual != h.size {
        return Err(HandoverRefusal::WrongSize {
            name: h.name.clone(),
            size: h.size,
            actual,
        });
    }
    Ok(file)
}
