//! The object store's side of attaching (docs/ARCHITECTURE.md "Objects", "Loss"): after each
//! attach the worker reports the copies its store holds (`ObjectsHeld`, in batches of at most
//! [`MAX_HELD_BATCH`]), and deletes those the head answers it does not count (`DropCopies`).
//!
//! Why on every attach: the worker cannot tell whether the head declared its node lost while
//! the stream was down (and dropped its copies from the table), or whether the head's state was
//! restored from a backup; a head whose table counts every copy already makes no write. A copy
//! is reported with the store's number for it, and dropped only if the store still holds that
//! very copy: one stored again since (a task's result written anew by a later attempt) stays.
//! A copy with no namespace recorded (sealed a moment ago, its namespace not yet written down)
//! waits for the next attach. A worker the head group no longer knows (it registers as a new
//! node) deletes every copy first: their ids are the old group's and may be given out again.

use escher_proto::types::{DroppedHeld, HeldCopy, MAX_HELD_BATCH, Namespace, WorkerMessage};

use super::Runtime;

impl Runtime {
    /// Reports the copies this node's store holds, in batches.
    pub(super) fn report_held(&mut self) {
        let objects = &self.env.objects;
        let mut held = Vec::new();
        for (info, copy) in objects.store().copies() {
            let Some(namespace) = objects.namespace(info.id) else {
                continue;
            };
            let namespace = match namespace.map(|ns| Namespace::new(&ns)).transpose() {
                Ok(ns) => ns,
                Err(err) => {
                    tracing::warn!(object = %info.id, %err, "a copy's namespace does not parse");
                    continue;
                }
            };
            held.push(HeldCopy {
                id: info.id,
                size: info.size,
                checksum: info.crc32c,
                namespace,
                copy,
            });
        }
        if held.is_empty() {
            return;
        }
        tracing::debug!(
            copies = held.len(),
            "reporting the copies this node's store holds"
        );
        while !held.is_empty() {
            let rest = held.split_off(held.len().min(MAX_HELD_BATCH));
            let batch = std::mem::replace(&mut held, rest);
            self.send(WorkerMessage::ObjectsHeld(batch));
        }
    }

    /// Deletes every copy in the store: the head group that knew them is gone (it does not
    /// know this worker's identity any more), and the next may give their ids out again.
    pub(super) fn drop_all_copies(&mut self) {
        let copies = self.env.objects.store().copies();
        if copies.is_empty() {
            return;
        }
        tracing::info!(
            copies = copies.len(),
            "deleting the object copies of a head group that no longer knows this worker"
        );
        let reason = "the head group that recorded it no longer knows this worker".to_string();
        let drops = copies
            .into_iter()
            .map(|(info, copy)| DroppedHeld {
                id: info.id,
                copy,
                reason: reason.clone(),
            })
            .collect();
        self.drop_copies(drops);
    }

    /// The head does not count these copies this worker reported: each goes, if the store
    /// still holds that copy (a reader that has it mapped keeps it until it lets go).
    pub(super) fn drop_copies(&mut self, copies: Vec<DroppedHeld>) {
        for DroppedHeld { id, copy, reason } in copies {
            match self.env.objects.delete_copy(id, copy) {
                Ok(true) => {
                    tracing::info!(object = %id, %reason, "deleted a copy the head does not count")
                }
                Ok(false) => {
                    tracing::debug!(object = %id, "a copy the head does not count is gone already")
                }
                Err(err) => {
                    tracing::warn!(object = %id, %err, "could not delete a copy the head does not count")
                }
            }
        }
    }
}
