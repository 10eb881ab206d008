//! The fetcher: brings a copy of an object from the nodes that hold one into this node's
//! store (docs/ARCHITECTURE.md "Objects", "Fetch").
//!
//! [`fetch_object`] asks each holder in turn (`Objects.Fetch` on its data plane, with the read
//! ticket the head gave for that holder) and writes the chunks, checked by
//! [`ChunkReader`], into one [`ObjectWriter`](super::ObjectWriter). A holder that goes away or
//! sends a bad chunk mid-transfer is left for the next one, which is asked for the rest from
//! where the good bytes stopped; a copy whose whole checksum fails is dropped and fetched again
//! whole from the next. The copy is sealed only whole and checked, so no partial object is
//! ever visible. When every holder fails, the error names the object and each node with why.
//!
//! An object already here is answered at once; one being written here by another fetch is
//! waited for.

use std::fmt;
use std::time::Duration;

use escher_proto::NodeId;
use escher_proto::data_channel;
use escher_proto::object_stream;
use escher_proto::transfer::{ChunkReader, MAX_MESSAGE_BYTES, ObjectMeta};
use escher_proto::wire;

use super::{NodeObjects, ObjectError, ObjectId, ObjectView, ObjectWriter};

/// How long a connection to a holder may take.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(3);

/// How long a fetch waits for a copy another fetch on this node is writing.
const WAIT_FOR_OTHER: Duration = Duration::from_secs(600);

/// One node that holds a copy, and how to ask it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Holder {
    /// The node.
    pub node: NodeId,
    /// Its data-plane address, `HOST:PORT`.
    pub address: String,
    /// A read ticket for the object, signed for that node.
    pub ticket: String,
}

/// Why one holder did not give the object.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HolderFailure {
    /// The node.
    pub node: NodeId,
    /// Its address.
    pub address: String,
    /// Why.
    pub why: String,
}

impl fmt::Display for HolderFailure {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "node {} at {}: {}", self.node, self.address, self.why)
    }
}

/// Why an object could not be fetched into this node's store.
#[derive(Debug, thiserror::Error)]
pub enum FetchError {
    /// No holder was given.
    #[error("object {id} has no holder to fetch it from")]
    NoHolders {
        /// The object.
        id: ObjectId,
    },
    /// Every holder failed.
    #[error("object {id} could not be fetched from any of its holders: {}", list(.failures))]
    AllHoldersFailed {
        /// The object.
        id: ObjectId,
        /// Each holder tried, with why it failed.
        failures: Vec<HolderFailure>,
    },
    /// This node's store refused the copy (no room, a full disk).
    #[error(transparent)]
    Store(#[from] ObjectError),
}

fn list(failures: &[HolderFailure]) -> String {
    let parts: Vec<String> = failures.iter().map(ToString::to_string).collect();
    parts.join("; ")
}

impl FetchError {
    /// Whether it may succeed later unchanged (a holder unreachable now, a store full now).
    pub fn is_retryable(&self) -> bool {
        !matches!(self, FetchError::NoHolders { .. })
    }
}

/// Brings object `id` into this node's store from `holders` (see the module doc), records
/// its `namespace`, and returns it mapped.
pub async fn fetch_object(
    objects: &NodeObjects,
    id: ObjectId,
    namespace: Option<String>,
    holders: &[Holder],
) -> Result<ObjectView, FetchError> {
    if let Some(view) = present(objects, id).await? {
        return Ok(view);
    }
    if holders.is_empty() {
        return Err(FetchError::NoHolders { id });
    }
    let mut copy: Option<(ObjectWriter, ChunkReader)> = None;
    let mut failures = Vec::new();
    // How many times a holder is asked again after another fetch on this node that was
    // writing the object left no copy (it failed, or its copy was not yet in sight).
    let mut again = 3;
    let mut next = 0;
    while let Some(holder) = holders.get(next) {
        next += 1;
        match from_holder(objects, id, holder, &mut copy).await {
            Ok(Some(writer)) => {
                let (writer, meta) = writer;
                let sealing = std::time::Instant::now();
                let store_objects = objects.clone();
                let sealed = tokio::task::spawn_blocking(move || writer.seal(meta.crc32c))
                    .await
                    .map_err(|e| join_failed(id, e))?;
                match sealed {
                    Ok(_) => {
                        tracing::debug!(object = %id, took = ?sealing.elapsed(), "sealed");
                        store_objects.record(id, namespace);
                        let store = objects.store().clone();
                        return tokio::task::spawn_blocking(move || store.get(id))
                            .await
                            .map_err(|e| join_failed(id, e))?
                            .map_err(FetchError::Store);
                    }
                    // A bad copy: dropped (by the seal), fetched again whole from the next.
                    Err(e) => failures.push(failure(holder, e.to_string())),
                }
            }
            Ok(None) => {
                // Another fetch on this node wrote it meanwhile.
                if let Some(view) = present(objects, id).await? {
                    return Ok(view);
                }
                if again > 0 {
                    again -= 1;
                    next -= 1;
                    tokio::time::sleep(Duration::from_millis(20)).await;
                }
            }
            Err(why) => {
                tracing::debug!(object = %id, node = %holder.node, %why, "a holder failed; trying the next");
                failures.push(failure(holder, why));
            }
        }
    }
    Err(FetchError::AllHoldersFailed { id, failures })
}

fn failure(holder: &Holder, why: String) -> HolderFailure {
    HolderFailure {
        node: holder.node,
        address: holder.address.clone(),
        why,
    }
}

fn join_failed(id: ObjectId, e: tokio::task::JoinError) -> FetchError {
    FetchError::Store(ObjectError::io(
        format!("seal fetched object {id} in"),
        "the object store",
        std::io::Error::other(e.to_string()),
    ))
}

/// The object, when it is here or being written here by another fetch (waited for).
async fn present(objects: &NodeObjects, id: ObjectId) -> Result<Option<ObjectView>, FetchError> {
    let deadline = tokio::time::Instant::now() + WAIT_FOR_OTHER;
    loop {
        let store = objects.store().clone();
        let got = tokio::task::spawn_blocking(move || store.get(id))
            .await
            .map_err(|e| join_failed(id, e))?;
        match got {
            Ok(view) => return Ok(Some(view)),
            Err(ObjectError::NotFound { .. }) if !objects.store().is_writing(id) => {
                return Ok(None);
            }
            Err(ObjectError::NotFound { .. }) if tokio::time::Instant::now() < deadline => {
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            Err(e) => return Err(FetchError::Store(e)),
        }
    }
}

/// Reads one holder's Fetch stream into `copy` (made at the first header), from where an
/// earlier holder stopped. `Ok(Some)` when the object came whole (to be sealed), `Ok(None)`
/// when another fetch on this node is writing it, `Err` with why this holder failed (the
/// good bytes stay in `copy` for the next).
async fn from_holder(
    objects: &NodeObjects,
    id: ObjectId,
    holder: &Holder,
    copy: &mut Option<(ObjectWriter, ChunkReader)>,
) -> Result<Option<(ObjectWriter, ObjectMeta)>, String> {
    let start = std::time::Instant::now();
    let mut channel = data_channel::connect(&holder.address, CONNECT_TIMEOUT)
        .await
        .map_err(|e| e.to_string())?;
    let connected = start.elapsed();
    let offset = copy.as_ref().map_or(0, |(_, reader)| reader.received());
    let request = wire::FetchRequest {
        ticket: holder.ticket.clone(),
        owner: id.owner(),
        index: id.index(),
        offset,
    };
    // Read by hand, so that each chunk's bytes are a slice of the frame they came in.
    let mut stream = object_stream::fetch(&mut channel, &request, MAX_MESSAGE_BYTES)
        .await
        .map_err(|s| format!("{:?}: {}", s.code(), s.message()))?;
    if let Some((_, reader)) = copy.as_mut() {
        let meta = reader
            .meta()
            .unwrap_or_else(|| unreachable!("a copy is made at a header"));
        *reader = ChunkReader::resume(meta, reader.received());
    }
    let mut fresh = ChunkReader::new(Some(id), 0);
    loop {
        let chunk = match stream.message().await {
            Ok(Some(chunk)) => chunk,
            Ok(None) => break,
            Err(s) => {
                let received = copy.as_ref().map_or(0, |(_, r)| r.received());
                return Err(format!(
                    "the stream broke off after {received} bytes: {:?}: {}",
                    s.code(),
                    s.message()
                ));
            }
        };
        let Some((writer, reader)) = copy.as_mut() else {
            // The first holder's header: room is made for the object now.
            let piece = fresh.accept(chunk).map_err(|e| e.to_string())?;
            let meta = piece
                .header
                .unwrap_or_else(|| unreachable!("a first message is checked to carry the header"));
            let store = objects.store().clone();
            let created = tokio::task::spawn_blocking(move || store.create_streamed(id, meta.size))
                .await
                .map_err(|e| e.to_string())?;
            let mut writer = match created {
                Ok(writer) => writer,
                Err(ObjectError::Exists { .. }) => return Ok(None),
                Err(e) => return Err(e.to_string()),
            };
            writer
                .write_summed(piece.offset, &piece.data, piece.crc32c)
                .map_err(|e| e.to_string())?;
            *copy = Some((
                writer,
                std::mem::replace(&mut fresh, ChunkReader::new(Some(id), 0)),
            ));
            continue;
        };
        let piece = reader.accept(chunk).map_err(|e| e.to_string())?;
        // tmpfs pages: a memory copy, shorter than a hop to a blocking thread would be.
        writer
            .write_summed(piece.offset, &piece.data, piece.crc32c)
            .map_err(|e| e.to_string())?;
    }
    tracing::debug!(object = %id, node = %holder.node, ?connected, took = ?start.elapsed(), "streamed from a holder");
    let Some((writer, reader)) = copy.take() else {
        return Err("the stream ended before its header".to_string());
    };
    match reader.finish() {
        Ok(meta) => Ok(Some((writer, meta))),
        Err(e) => {
            let why = e.to_string();
            // Truncated: the good bytes stay for the next holder. Otherwise start over.
            if matches!(e, escher_proto::transfer::TransferError::Truncated { .. }) {
                *copy = Some((writer, reader));
            }
            Err(why)
        }
    }
}
