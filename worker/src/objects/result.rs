//! A function's result larger than [`INLINE_RESULT_BYTES`] (100 KiB) stays on this node: it is
//! written into the store as the object `(task id, 0)` ([`ObjectId::task_result`]) and sealed
//! before the attempt's `TaskFinished` leaves, which carries only its size and CRC-32C
//! ([`TaskResult::Object`]). The head records this node as its holder in the same log entry as
//! the completion, so a "succeeded" is never told before the reference is (docs/ARCHITECTURE.md
//! "Objects"). The same id whichever attempt makes it: a rebuild (lineage) writes it again.
//!
//! An actor call's result above the same threshold, when its call names an object id of the
//! caller's session, is kept the same way ([`keep_call_result`], called by the `Actors`
//! service), and the caller records it.

use escher_proto::types::{INLINE_RESULT_BYTES, ObjectId, TaskId, TaskResult};

use super::NodeObjects;

/// The result `bytes` of task `task` (of namespace `namespace`): inline when at most
/// [`INLINE_RESULT_BYTES`], else sealed in this node's store and referred to. A store that
/// cannot take it fails the attempt with a message naming the object and why.
pub(crate) fn keep_result(
    objects: &NodeObjects,
    task: TaskId,
    namespace: Option<String>,
    bytes: Vec<u8>,
) -> Result<TaskResult, String> {
    if bytes.len() <= INLINE_RESULT_BYTES {
        return Ok(TaskResult::Returned(bytes.into()));
    }
    let id = ObjectId::task_result(task);
    let size = bytes.len() as u64;
    let checksum = crc32c::crc32c(&bytes);
    let refused = |e: &dyn std::fmt::Display| {
        format!("its result of {size} bytes could not be kept as object {id} on this node: {e}")
    };
    // An earlier attempt's copy (one whose completion the head refused) gives way.
    if objects.store().contains(id) {
        objects.delete(id).map_err(|e| refused(&e))?;
    }
    let mut writer = objects.store().create(id, size).map_err(|e| refused(&e))?;
    writer.append(&bytes).map_err(|e| refused(&e))?;
    writer.seal(checksum).map_err(|e| refused(&e))?;
    objects.record(id, namespace);
    Ok(TaskResult::Object { size, checksum })
}

/// The first object session number (the head's `escher_core::state::FIRST_SESSION`): ids
/// whose owner is at least this are sessions', below it tasks'.
const FIRST_SESSION: u64 = 1 << 63;

/// An actor call's result `bytes`, larger than [`INLINE_RESULT_BYTES`], kept in this node's
/// store as object `id`, the id of the caller's object session its call named (for the
/// actor's namespace `namespace`): sealed, then recorded, before the call is answered with its
/// size and CRC-32C. The caller has the head record the copy (`ObjectsSealed`), as after a
/// put. Refused, with why, for an id that is not a session's (a task's result id is the
/// head's to give) or that this store holds already (each id is kept once); the call is then
/// answered inline, as it would have been before objects.
pub(crate) fn keep_call_result(
    objects: &NodeObjects,
    id: ObjectId,
    namespace: Option<String>,
    bytes: &[u8],
) -> Result<(u64, u32), String> {
    if id.owner() < FIRST_SESSION {
        return Err(format!(
            "object {id} is not an object session's id: an actor call's result is kept only \
             under its caller's session"
        ));
    }
    if objects.store().contains(id) {
        return Err(format!("object {id} is held here already"));
    }
    let size = bytes.len() as u64;
    let checksum = crc32c::crc32c(bytes);
    let refused = |e: &dyn std::fmt::Display| {
        format!("the result of {size} bytes could not be kept as object {id}: {e}")
    };
    let mut writer = objects.store().create(id, size).map_err(|e| refused(&e))?;
    writer.append(bytes).map_err(|e| refused(&e))?;
    writer.seal(checksum).map_err(|e| refused(&e))?;
    objects.record(id, namespace);
    Ok((size, checksum))
}
