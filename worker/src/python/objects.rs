//! A Python task's own `escher.get` of an object, served by its worker: the interpreter asks,
//! mid-task, on its answer pipe; the worker brings a copy into this node's store (the way an
//! object argument arrives: `objects/args.rs`, [`bring`]) and hands the sealed file's
//! descriptor back on the interpreter's control socket (its stderr, where the task's log files
//! came), which the interpreter maps read-only: the value's large buffers are the store's own
//! pages, never a copy in the task's memory.
//!
//! ```text
//! request (interpreter → worker, on its stdout pipe, between answers):
//!   function task:  len:u32=17 status:u8=3 owner:u64 index:u64
//!   actor:          len:u32=25 status:u8=3 seq:u64=0 owner:u64 index:u64
//! reply (worker → interpreter, on the control socket):
//!   len:u32 status:u8 body
//!     status 0: size:u64, with the sealed file's descriptor (SCM_RIGHTS) on the first byte
//!     status 1: NAME "\n" TEXT: the error to raise (`NotFoundError`, `ObjectLostError`,
//!               `AuthError`, `InvalidArgumentError`, `EscherError`), TEXT naming the object
//! ```
//!
//! (big-endian, as the frames). The interpreter holds one request open at a time (a lock:
//! threads of one task, or an actor's concurrent calls, take turns). The copy is fetched with
//! the task's own credential (an actor's: its constructor's), so in its namespace, checked
//! against the head's length and CRC-32C, and reported to the head as an argument's is
//! (locality then sees it); it counts in the store as an argument's copy does (spilling
//! applies). An object this task was given as an argument is handed over as it is; one
//! already in this node's store is mapped with no fetch (the head is still asked where it is,
//! which refuses a freed object, another namespace's and a lost one, as a client's read would).
//!
//! A function task's copies stay pinned (neither spilled nor unlinked) until the task answers,
//! as its arguments do; an actor's are pinned only until the descriptor is handed over (an
//! actor lives long): the interpreter's mapping keeps the pages it mapped either way, even
//! once the store spills or deletes the file.

use std::os::fd::{AsRawFd, RawFd};
use std::time::Duration;

use escher_proto::types::ObjectId;

use crate::context::TaskContext;
use crate::objects::ObjectView;
use crate::objects::args::{Unavailable, bring};

/// The status of a request frame on the interpreter's answer pipe: an `escher.get`.
pub(super) const GET: u8 = 3;

/// The longest error text sent back (the rest is cut).
const MAX_TEXT: usize = 16 * 1024;

/// Reads a request's body: the object's id.
pub(super) fn parse(body: &[u8]) -> Result<ObjectId, String> {
    let bytes: &[u8; 16] = body.try_into().map_err(|_| {
        format!(
            "an object request of {} bytes, not 16 (owner, index)",
            body.len()
        )
    })?;
    let (owner, index) = bytes.split_at(8);
    let word = |b: &[u8]| u64::from_be_bytes(b.try_into().unwrap_or_default());
    Ok(ObjectId(word(owner), word(index)))
}

/// Object `id` in this node's store for the task of `ctx`: its argument, or a copy brought
/// here now.
pub(super) async fn serve(ctx: &TaskContext, id: ObjectId) -> Result<ObjectView, Unavailable> {
    if let Some(view) = ctx.object_arg(id) {
        return Ok(view.clone());
    }
    let Some(objects) = ctx.node_objects() else {
        return Err(Unavailable::Other(format!(
            "object {id}: this task's context has no object store"
        )));
    };
    bring(objects, ctx, id).await
}

/// Answers a request for `id` on `ctl`, the worker's end of the interpreter's control socket:
/// the sealed file's descriptor, or the error to raise.
pub(super) async fn reply(
    ctl: &std::os::unix::net::UnixStream,
    id: ObjectId,
    answer: &Result<ObjectView, Unavailable>,
) -> std::io::Result<()> {
    let failed = |name: &str, text: &str| {
        let mut text = if text.contains(&id.to_string()) {
            text.to_string()
        } else {
            format!("object {id}: {text}")
        };
        if text.len() > MAX_TEXT {
            let mut cut = MAX_TEXT;
            while !text.is_char_boundary(cut) {
                cut -= 1;
            }
            text.truncate(cut);
        }
        frame(1, format!("{name}\n{text}").as_bytes())
    };
    let (bytes, file) = match answer {
        Ok(view) => match std::fs::File::open(view.path()) {
            Ok(file) => (frame(0, &view.len().to_be_bytes()), Some(file)),
            Err(e) => (
                failed(
                    "EscherError",
                    &format!(
                        "cannot open object {id}'s file {} for the interpreter: {e}",
                        view.path().display()
                    ),
                ),
                None,
            ),
        },
        Err(why) => {
            let name = match why {
                Unavailable::NotFound(_) => "NotFoundError",
                Unavailable::Lost(_) => "ObjectLostError",
                Unavailable::Denied(_) => "AuthError",
                Unavailable::Invalid(_) => "InvalidArgumentError",
                Unavailable::Other(_) => "EscherError",
            };
            (failed(name, why.text()), None)
        }
    };
    let fds: Vec<RawFd> = file.iter().map(|f| f.as_raw_fd()).collect();
    send_all(ctl, &bytes, &fds).await
}

fn frame(status: u8, body: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(5 + body.len());
    // Bodies are at most 16 KiB and a few bytes.
    out.extend_from_slice(&(body.len() as u32 + 1).to_be_bytes());
    out.push(status);
    out.extend_from_slice(body);
    out
}

/// Writes `bytes` on the non-blocking socket `ctl`, `fds` with the first byte; waits a moment
/// and tries again while the interpreter's side is full (it reads the reply it waits for).
async fn send_all(
    ctl: &std::os::unix::net::UnixStream,
    bytes: &[u8],
    fds: &[RawFd],
) -> std::io::Result<()> {
    use nix::sys::socket::{ControlMessage, MsgFlags, sendmsg};
    let flags = MsgFlags::MSG_DONTWAIT | MsgFlags::MSG_NOSIGNAL;
    let mut at = 0;
    let mut waited = Duration::ZERO;
    while at < bytes.len() {
        let rights = [ControlMessage::ScmRights(fds)];
        let cmsg: &[ControlMessage<'_>] = if at == 0 && !fds.is_empty() {
            &rights
        } else {
            &[]
        };
        let iov = [std::io::IoSlice::new(&bytes[at..])];
        match sendmsg::<()>(ctl.as_raw_fd(), &iov, cmsg, flags, None) {
            Ok(n) => at += n,
            Err(nix::errno::Errno::EAGAIN) if waited < Duration::from_secs(10) => {
                tokio::time::sleep(Duration::from_millis(5)).await;
                waited += Duration::from_millis(5);
            }
            Err(nix::errno::Errno::EINTR) => {}
            Err(e) => return Err(std::io::Error::from(e)),
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_a_request() {
        let mut body = 7u64.to_be_bytes().to_vec();
        body.extend_from_slice(&3u64.to_be_bytes());
        assert_eq!(parse(&body).unwrap(), ObjectId(7, 3));
        assert!(parse(&body[..15]).unwrap_err().contains("15 bytes"));
    }

    #[tokio::test]
    async fn an_error_names_its_kind_and_the_object() {
        let (ours, theirs) = std::os::unix::net::UnixStream::pair().unwrap();
        ours.set_nonblocking(true).unwrap();
        let id = ObjectId(5, 1);
        let why = Unavailable::NotFound("object 5.1 was freed".into());
        reply(&ours, id, &Err(why)).await.unwrap();
        let why = Unavailable::Lost("it has no copy".into());
        reply(&ours, id, &Err(why)).await.unwrap();
        drop(ours);
        let mut got = Vec::new();
        std::io::Read::read_to_end(&mut &theirs, &mut got).unwrap();
        let first = b"NotFoundError\nobject 5.1 was freed";
        assert_eq!(&got[..4], &(first.len() as u32 + 1).to_be_bytes());
        assert_eq!(got[4], 1);
        assert_eq!(&got[5..5 + first.len()], first);
        let rest = &got[5 + first.len()..];
        assert_eq!(&rest[5..], b"ObjectLostError\nobject 5.1: it has no copy");
    }
}
