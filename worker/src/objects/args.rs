//! A task's object arguments (the `escher.objects` label, `Task::object_arg` on the client):
//! before the task runs, each is brought into this node's store from a holder, worker to
//! worker ([`fetch_object`]: checked chunk by chunk and whole, the next holder asked when one
//! fails), and the new copy reported so that the head publishes its location on this node. An
//! object already here is not copied. The task then reads each mapped from the store
//! (`TaskContext::object_args`) as soon as it is sealed and checked: the copy's report goes to
//! the head in the background, and the attempt's end waits for its answer (the head knows the
//! copy before it learns the task ended; a copy it leaves out is deleted once the task lets go
//! of it).
//!
//! Where the copies are comes with the task: the head puts each argument, located as
//! `LocateObject` would answer the task's credential (holders, data addresses, read tickets),
//! into its `Assign`, so that the fetch needs no call to the head first. The worker asks
//! `LocateObject` itself for an argument the `Assign` does not locate (a head that does not
//! fill it in, an object lost since), and when the fetch from the holders it names fails: a
//! holder may have gone since the assignment, a ticket may have expired in a queue. Every
//! copy is checked against the length and CRC-32C of the answer it was fetched by.
//!
//! An argument may have no copy for a while: its only holder was lost and its task runs again
//! to make it (lineage), or its holder died and the head has not yet counted the node lost. The
//! task then waits, holding what it was given, and asks the head again with a growing pause:
//! for a copy of an argument that has none, up to [`REBUILD_PATIENCE`] (as a client's read of a
//! result object waits); through holders that fail, up to [`FETCH_PATIENCE`] (enough for the
//! head's heartbeat timeout to count a dead holder lost). An argument the head reports lost,
//! freed or unknown fails the task at once, naming it.
//!
//! A Python task's own `escher.get` of an object it was not given as an argument takes the same
//! way ([`bring`], asked by its interpreter mid-task: `python/objects.rs`); what went wrong is
//! then told apart ([`Unavailable`]), so that the interpreter raises the error a client's read
//! would have raised.

use std::time::Duration;

use escher_proto::types::{Labels, OBJECTS_LABEL, ObjectId, parse_object_args};
use tokio::time::Instant;

use super::{Holder, NodeObjects, ObjectView, fetch_object};
use crate::context::TaskContext;

/// What the head knows of an object: its length, checksum and holders with read tickets.
type Located = escher_proto::types::ObjectView;

/// How long a task waits for an argument that has no copy (its task runs again to make it).
pub(crate) const REBUILD_PATIENCE: Duration = Duration::from_secs(120);

/// How long a task keeps asking again when the holders the head names fail.
pub(crate) const FETCH_PATIENCE: Duration = Duration::from_secs(30);

/// The first and the longest pause between two questions to the head.
const PAUSE: (Duration, Duration) = (Duration::from_millis(100), Duration::from_secs(1));

/// Brings the objects `labels` names into this node's store, in their order, each from the
/// holders `located` names for it (the task's `Assign`) and else from those the head names
/// now; the first that cannot be had fails the whole with a message naming it (unknown,
/// freed, lost with its node and why, or every holder's failure).
pub(crate) async fn fetch_args(
    objects: &NodeObjects,
    ctx: &TaskContext,
    labels: &Labels,
    located: &[Located],
) -> Result<Vec<ObjectView>, String> {
    let Some(value) = labels.get(OBJECTS_LABEL) else {
        return Ok(Vec::new());
    };
    let ids = parse_object_args(value).map_err(|e| format!("label {OBJECTS_LABEL}: {e}"))?;
    let mut views = Vec::with_capacity(ids.len());
    for id in ids {
        let given = located.iter().find(|info| info.id == id);
        let view = bring_located(objects, ctx, id, given)
            .await
            .map_err(|e| format!("object argument {id}: {e}"))?;
        views.push(view);
    }
    Ok(views)
}

/// Why an object could not be brought into this node's store, told apart as a client's read
/// tells them apart (`escher-client`'s `ClientError`), with the text that says it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Unavailable {
    /// The head does not know it in the task's namespace: freed, unknown, another namespace's.
    NotFound(String),
    /// It has no copy and none comes (its node was lost, nothing rebuilds it), or no holder
    /// gave it whole within the patience.
    Lost(String),
    /// The task's credential may not read it.
    Denied(String),
    /// The head refused the request as malformed.
    Invalid(String),
    /// Anything else: the head unreachable, this node's store refusing the copy.
    Other(String),
}

impl Unavailable {
    /// The text, which names the object.
    pub(crate) fn text(&self) -> &str {
        match self {
            Unavailable::NotFound(t)
            | Unavailable::Lost(t)
            | Unavailable::Denied(t)
            | Unavailable::Invalid(t)
            | Unavailable::Other(t) => t,
        }
    }

    /// A refused `LocateObject`, read as the client reads it.
    fn from_locate(err: &crate::error::WorkerError) -> Unavailable {
        use tonic::Code;
        let crate::error::WorkerError::Rpc { status, .. } = err else {
            return Unavailable::Other(err.to_string());
        };
        let text = status.message().to_string();
        match status.code() {
            Code::NotFound => Unavailable::NotFound(text),
            // The head refuses a lost object's locate with FAILED_PRECONDITION; its text is
            // the state's `ObjectLost` error.
            Code::FailedPrecondition if text.contains(" is lost: ") => Unavailable::Lost(text),
            Code::InvalidArgument | Code::FailedPrecondition => Unavailable::Invalid(text),
            Code::PermissionDenied | Code::Unauthenticated => Unavailable::Denied(text),
            _ => Unavailable::Other(err.to_string()),
        }
    }
}

impl std::fmt::Display for Unavailable {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.text())
    }
}

/// Brings object `id` into this node's store (from a holder, worker to worker, unless it is
/// here already) where the head says it is now, checks it against the head's length and
/// CRC-32C, and reports a new copy. Also how a Python task's argument that is an earlier
/// task's result object arrives (`python/mod.rs`), and a Python task's own `escher.get`
/// (`python/objects.rs`).
pub(crate) async fn bring(
    objects: &NodeObjects,
    ctx: &TaskContext,
    id: ObjectId,
) -> Result<ObjectView, Unavailable> {
    bring_located(objects, ctx, id, None).await
}

/// [`bring`], from the holders `given` names first when there is such an answer; the head is
/// asked only when there is none or it does not bring the object.
async fn bring_located(
    objects: &NodeObjects,
    ctx: &TaskContext,
    id: ObjectId,
    given: Option<&Located>,
) -> Result<ObjectView, Unavailable> {
    if let Some(info) = given {
        match from_holders(objects, ctx, id, info).await {
            Ok(view) => return Ok(view),
            Err(why) => {
                tracing::info!(object = %id, %why, "the holders the assignment named did not \
                                give the object; asking the head where it is now");
            }
        }
    }
    let start = Instant::now();
    let mut pause = PAUSE.0;
    loop {
        let asked = Instant::now();
        let info = ctx
            .locate_object(id)
            .await
            .map_err(|e| Unavailable::from_locate(&e))?;
        tracing::debug!(object = %id, took = ?asked.elapsed(), "located");
        let waited = start.elapsed();
        let retry = if info.holders.is_empty() {
            if waited >= REBUILD_PATIENCE {
                return Err(Unavailable::Lost(format!(
                    "it has no copy, and none was made again within {} s",
                    REBUILD_PATIENCE.as_secs()
                )));
            }
            "it has no copy yet (its task may be running again to make it)".to_string()
        } else {
            match from_holders(objects, ctx, id, &info).await {
                Ok(view) => return Ok(view),
                Err(why) if waited < FETCH_PATIENCE => why,
                // No holder gave it whole: a client's read says the same (`ObjectUnavailable`).
                Err(why) => return Err(Unavailable::Lost(why)),
            }
        };
        tracing::debug!(object = %id, why = %retry, ?pause, "asking the head again");
        tokio::time::sleep(pause).await;
        pause = (pause * 2).min(PAUSE.1);
    }
}

/// Brings object `id` from the holders `info` names (none when it is here), checks the copy
/// against `info`'s length and CRC-32C, and reports it when it is new, in the background
/// ([`TaskContext::report_copy_in_background`]).
async fn from_holders(
    objects: &NodeObjects,
    ctx: &TaskContext,
    id: ObjectId,
    info: &Located,
) -> Result<ObjectView, String> {
    let namespace = ctx.namespace().map(|ns| ns.as_str().to_owned());
    let here = ctx.node_id();
    let local = info.holders.iter().any(|h| h.node == here);
    let holders: Vec<Holder> = info
        .holders
        .iter()
        .filter(|h| h.node != here)
        .filter_map(|h| {
            Some(Holder {
                node: h.node,
                address: h.address.clone()?,
                ticket: h.ticket.clone()?,
            })
        })
        .collect();
    let start = Instant::now();
    let view = fetch_object(objects, id, namespace, &holders)
        .await
        .map_err(|e| e.to_string())?;
    let fetched = start.elapsed();
    if (view.len(), view.crc32c()) != (info.size, info.checksum) {
        return Err(format!(
            "this node's copy has {} bytes with CRC-32C {:08x}, the head recorded {} bytes \
             with {:08x}",
            view.len(),
            view.crc32c(),
            info.size,
            info.checksum
        ));
    }
    // Reported in the background: the task reads the copy now that it is sealed and checked
    // (a copy the head leaves out is deleted once the task lets go of it), and the attempt's
    // end waits for the answer.
    if !local {
        ctx.report_copy_in_background(objects, &view);
    }
    tracing::debug!(object = %id, size = view.len(), ?fetched, "brought into this node's store");
    Ok(view)
}
