//! `Objects.Map`: a sealed object lent to a reader on this machine as its file, to map instead
//! of fetching a copy (docs/ARCHITECTURE.md "Objects", "Same-node reads").
//!
//! The mirror of `handover.rs`: there a client names its sealed memfd by its pid and the
//! descriptor's number and the worker opens it through `/proc`; here the worker, once the read
//! ticket is admitted as for a fetch, opens the object's sealed file of its store (read-only)
//! and names it by its own pid (as the host's `/proc` names it) and the descriptor's number,
//! with the file's device, inode and size, which the reader compares with what it opened.
//! The answer's stream stays open while the reader maps the file: the stream holds the
//! [`ObjectView`] (so the object is pinned: neither spilled, moved nor unlinked) and the open
//! descriptor, and both go when the reader ends the stream, or when the worker stops (the
//! reader's mapping keeps its pages then, as any mapping of an unlinked file does).
//!
//! Only the bytes a sealed copy holds are lent: the store sealed it whole and checked, it is
//! read-only (0444) and never written again, so a reader maps it with no checksum of its own.
//! A reader of another machine is refused at once (FAILED_PRECONDITION), and a reader that
//! cannot open the descriptor (another user's worker, another PID namespace) fetches instead.

use std::fs::File;
use std::future::Future;
use std::os::fd::AsRawFd;
use std::os::unix::fs::MetadataExt;
use std::pin::Pin;
use std::task::{Context, Poll};

use escher_proto::wire;
use tokio_stream::Stream;
use tokio_util::sync::{CancellationToken, WaitForCancellationFutureOwned};
use tonic::Status;

use super::handover::boot_id;
use super::{ObjectError, ObjectId, ObjectStore, ObjectView};

/// Why an object was not lent as its file (the reader then fetches it).
#[derive(Debug, thiserror::Error)]
pub(super) enum LendRefusal {
    /// The reader runs on another machine.
    #[error("the reader runs on another machine (boot id {reader:?}, this one's {this:?})")]
    OtherMachine { reader: String, this: String },
}

/// Why a lend failed: refused (the reader may fetch), or the store could not give the object.
#[derive(Debug)]
pub(super) enum LendError {
    Refused(LendRefusal),
    Store(ObjectError),
}

impl From<ObjectError> for LendError {
    fn from(e: ObjectError) -> Self {
        LendError::Store(e)
    }
}

/// An object lent to a reader: the answer's stream, which yields the grant once and then
/// stays open, holding the pin and the descriptor, until it is dropped or the worker stops.
pub(super) struct Lent {
    grant: Option<wire::MapGrant>,
    stopped: Pin<Box<WaitForCancellationFutureOwned>>,
    _view: ObjectView,
    _file: File,
}

/// Opens object `id`'s sealed file in `store` for a reader of the machine `reader_boot_id`
/// names, pinned. Blocking file I/O: call it off the async threads.
pub(super) fn lend(
    store: &ObjectStore,
    id: ObjectId,
    reader_boot_id: &str,
    stop: CancellationToken,
) -> Result<Lent, LendError> {
    let this = boot_id();
    if reader_boot_id != this || this.is_empty() {
        return Err(LendError::Refused(LendRefusal::OtherMachine {
            reader: reader_boot_id.to_string(),
            this: this.to_string(),
        }));
    }
    let view = store.get(id)?;
    let path = view.path().to_path_buf();
    let file = File::open(&path).map_err(|e| ObjectError::io("open", &path, e))?;
    let meta = file
        .metadata()
        .map_err(|e| ObjectError::io("stat", &path, e))?;
    let grant = wire::MapGrant {
        pid: crate::pidns::own_host_pid(),
        fd: file.as_raw_fd(),
        size: view.len(),
        crc32c: view.crc32c(),
        device: meta.dev(),
        inode: meta.ino(),
    };
    Ok(Lent {
        grant: Some(grant),
        stopped: Box::pin(stop.cancelled_owned()),
        _view: view,
        _file: file,
    })
}

impl Stream for Lent {
    type Item = Result<wire::MapGrant, Status>;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        if let Some(grant) = self.grant.take() {
            return Poll::Ready(Some(Ok(grant)));
        }
        // Nothing more to send: the stream ends when the reader drops it, or here when the
        // worker stops (so that its data plane's graceful shutdown does not wait for readers).
        match self.stopped.as_mut().poll(cx) {
            Poll::Ready(()) => Poll::Ready(None),
            Poll::Pending => Poll::Pending,
        }
    }
}
