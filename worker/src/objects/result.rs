//! A function's result larger than [`INLINE_RESULT_BYTES`] (100 KiB) stays on this node: it is
//! written into the store as the object `(task id, 0)` ([`ObjectId::task_result`]) and sealed
//! before the attempt's `TaskFinished` leaves, which carries only its size and CRC-32C
//! ([`TaskResult::Object`]). The head records this node as its holder in the same log entry as
//! the completion, so a "succeeded" is never told before the reference is (docs/ARCHITECTURE.md
//! "Objects"). The same id whichever attempt makes it: a rebuild (lineage) writes it again.

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
