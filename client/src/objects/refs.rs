//! [`Client::put`], [`Client::get_object`] and [`ObjectRef`]: values held by reference in the
//! workers' stores (docs/ARCHITECTURE.md "Objects").
//!
//! A `put` asks the head where the object goes (`PlaceObject`: a live worker's data-plane
//! address and a write ticket; the first `put` of a client also opens its object session),
//! hands the bytes to that worker as a sealed memfd when it runs on this machine
//! (`handover.rs`), else pushes them there ([`push_object`](super::push_object), with the
//! checksum it summed once), and reports the sealed copy (`ObjectsSealed`), so that the head
//! records it and publishes its location resource. Only then does `put` return. The two
//! halves are public too ([`Client::place_put`], then [`Client::put_placed`] or
//! [`Client::put_placed_file`]), for a caller that writes the bytes itself (Python's put
//! writes its parts straight into the memfd).
//! Ids are `(session, index)`: the session the head gave this client, the index counted here.
//!
//! A `get` asks the head where the copies are (`LocateObject`, with a read ticket per copy).
//! A holder on this machine lends its sealed file with that ticket, which the client maps
//! read-only (`map.rs`: no copy, the object pinned there while mapped); otherwise the bytes
//! are fetched from the first holder that answers ([`fetch_object`]), checked whole against
//! the length and CRC-32C the head recorded.
//!
//! The owner counts references: an [`ObjectRef`] and its clones share one count, and when the
//! last one is dropped the object is released. Releases travel in batches (`ReleaseObjects`)
//! from a background task of the client, started with its first `put`; the head then deletes
//! the copies and their location resources. An id copied out of a ref ([`ObjectRef::id`])
//! does not keep the object. The same task keeps the client's object session and closes it
//! (`session.rs`).

use std::fmt;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use bytes::Bytes;
use escher_proto::convert::object_id;
use escher_proto::types::{ObjectId, ObjectView};
use escher_proto::wire;
use tokio::sync::mpsc;

use super::fetch_object;
use super::handover;
use super::transfer::{ObjectTransferError, push_summed};
use crate::{Client, ClientError};

/// The first and the longest pause between tries of a push the worker could not take yet.
const PUSH_PAUSE: (Duration, Duration) = (Duration::from_millis(20), Duration::from_millis(500));
/// How long a put keeps trying a push the worker could not take yet.
const PUSH_PATIENCE: Duration = Duration::from_secs(10);

/// An object as [`Client::read_object`] reads it.
#[derive(Debug)]
pub enum ObjectRead {
    /// Fetched from a holder, checked whole: the bytes.
    Fetched(Bytes),
    /// Lent by a holder on this machine: its sealed file, to map (and its lease, to keep as
    /// long as the mapping).
    #[cfg(target_os = "linux")]
    Lent(Box<super::map::LentObject>),
}

/// A reference to an object this client put: [`get`](Self::get) reads it, and dropping the
/// last clone releases it (its copies are deleted). Cheap to clone.
#[derive(Clone)]
pub struct ObjectRef {
    inner: Arc<Owned>,
}

struct Owned {
    id: ObjectId,
    size: u64,
    checksum: u32,
    /// Whether its bytes reached the store as a sealed file of this machine (a put's).
    handed_over: bool,
    /// Given up ([`ObjectRef::disown`]): the last clone's drop releases nothing.
    disowned: AtomicBool,
    client: Client,
    releases: mpsc::UnboundedSender<ObjectId>,
}

impl Drop for Owned {
    fn drop(&mut self) {
        if self.disowned.load(Ordering::Acquire) {
            return;
        }
        // The release task ends only when every sender is gone, this one included.
        let _ = self.releases.send(self.id);
    }
}

impl fmt::Debug for ObjectRef {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ObjectRef")
            .field("id", &self.inner.id)
            .field("size", &self.inner.size)
            .finish_non_exhaustive()
    }
}

impl ObjectRef {
    /// A new owning reference to object `id` of this client's namespace (a task's result
    /// object, `results.rs`): dropping its last clone releases the object.
    pub(crate) fn owning(client: &Client, id: ObjectId, size: u64, checksum: u32) -> ObjectRef {
        ObjectRef::owning_copy(client, id, size, checksum, false)
    }

    /// [`owning`](Self::owning), saying whether this process handed the copy over from its own
    /// file ([`handed_over`](Self::handed_over)).
    fn owning_copy(
        client: &Client,
        id: ObjectId,
        size: u64,
        checksum: u32,
        handed_over: bool,
    ) -> ObjectRef {
        ObjectRef {
            inner: Arc::new(Owned {
                id,
                size,
                checksum,
                handed_over,
                disowned: AtomicBool::new(false),
                client: client.clone(),
                releases: client.puts().releases.clone(),
            }),
        }
    }

    /// Gives the object up: dropping the last clone of this ref no longer releases it. For a
    /// task that returns the ref (inside its result) to its caller, which then owns it
    /// ([`Client::adopt_object`]): the object was put into the caller's object session
    /// ([`Client::within_object_session`]), which releases it when it ends if nobody did.
    pub fn disown(&self) {
        self.inner.disowned.store(true, Ordering::Release);
    }

    /// The object's id (which does not keep it: only refs do).
    pub fn id(&self) -> ObjectId {
        self.inner.id
    }

    /// Its length in bytes.
    pub fn size(&self) -> u64 {
        self.inner.size
    }

    /// The CRC-32C (Castagnoli) of its bytes.
    pub fn checksum(&self) -> u32 {
        self.inner.checksum
    }

    /// Whether a put handed its bytes to the worker as a sealed file of this machine (rather
    /// than streamed them over the data plane); false for a task's result.
    pub fn handed_over(&self) -> bool {
        self.inner.handed_over
    }

    /// Its bytes, fetched from a worker that holds a copy ([`Client::get_object`]).
    pub async fn get(&self) -> Result<Bytes, ClientError> {
        self.inner.client.get_object(self.inner.id).await
    }
}

/// A put the head has placed ([`Client::place_put`]): the object's id, its size, and the
/// worker its bytes go to. Put its bytes with [`Client::put_placed`] (streamed) or, when
/// [`handover_name`](Self::handover_name) gives a name, with [`Client::put_placed_file`] (a
/// sealed memfd of that name, handed over).
#[derive(Debug)]
pub struct PlacedPut {
    id: ObjectId,
    size: u64,
    node: u64,
    address: String,
    ticket: String,
}

impl PlacedPut {
    /// The object's id.
    pub fn id(&self) -> ObjectId {
        self.id
    }

    /// Its size in bytes, as placed.
    pub fn size(&self) -> u64 {
        self.size
    }

    /// The name to give the memfd the object is written into to hand it over, when the
    /// worker it was placed on runs on this machine and handing over is not turned off
    /// (`ESCHER_PUT_HANDOVER=off`); `None` when its bytes must be streamed.
    pub fn handover_name(&self) -> Option<String> {
        handover::name_for(&self.address, &self.ticket, self.id)
    }
}

impl Client {
    /// Puts `bytes` into the store of a worker the head picks, and returns a reference that
    /// keeps the object while it (or a clone) lives. Returns once the copy is sealed whole and
    /// recorded by the head. The id is `(session, index)` (module documentation of
    /// `client/src/objects/refs.rs`). A worker on this machine is handed the bytes as a sealed
    /// file (`client/src/objects/handover.rs`); another is streamed them.
    pub async fn put(&self, bytes: impl Into<Bytes>) -> Result<ObjectRef, ClientError> {
        let bytes = bytes.into();
        let placed = self.place_put(bytes.len() as u64).await?;
        #[cfg(target_os = "linux")]
        if let Some(name) = placed.handover_name() {
            let data = bytes.clone();
            let file = tokio::task::spawn_blocking(move || handover::sealed_memfd(&name, &data))
                .await
                .map_err(|e| {
                    ClientError::ObjectUnavailable(format!(
                        "object {}: writing its memfd failed: {e}",
                        placed.id
                    ))
                })?;
            match file {
                Ok(file) => return self.put_placed_file(placed, &file, None).await,
                Err(e) => {
                    tracing::debug!(object = %placed.id, %e, "no memfd to hand the put over in; streaming it")
                }
            }
        }
        self.put_placed(placed, bytes).await
    }

    /// Asks the head where an object of `size` bytes goes (opening this client's object
    /// session with its first put): the first half of a [`put`](Self::put), for a caller that
    /// writes the bytes itself ([`put_placed_file`](Self::put_placed_file)).
    pub async fn place_put(&self, size: u64) -> Result<PlacedPut, ClientError> {
        let puts = self.puts();
        let index = puts.next.fetch_add(1, Ordering::Relaxed);
        if let Some(caller) = self.caller_session()
            && index < caller.count
        {
            // A task's put: into its caller's session, at an index of the task's own range.
            let id = ObjectId(caller.session, caller.first + index);
            let placed = self.place_object(caller.session, id.index(), size).await?;
            return Ok(PlacedPut {
                id,
                size,
                node: placed.node,
                address: placed.address,
                ticket: placed.ticket,
            });
        }
        let placed = {
            let mut session = puts.session.lock().await;
            if *session == 0 {
                let placed = self.place_object(0, index, size).await?;
                *session = placed.session;
                puts.opened(placed.session);
                placed
            } else {
                let s = *session;
                drop(session);
                self.place_object(s, index, size).await?
            }
        };
        Ok(PlacedPut {
            id: ObjectId(placed.session, index),
            size,
            node: placed.node,
            address: placed.address,
            ticket: placed.ticket,
        })
    }

    /// Streams `bytes` (of the placed size) into the placed worker's store over its data
    /// plane, then has the head record the copy.
    pub async fn put_placed(
        &self,
        placed: PlacedPut,
        bytes: Bytes,
    ) -> Result<ObjectRef, ClientError> {
        if bytes.len() as u64 != placed.size {
            return Err(ClientError::Usage(format!(
                "object {}: {} bytes to put, not the {} placed",
                placed.id,
                bytes.len(),
                placed.size
            )));
        }
        let checksum = crc32c::crc32c(&bytes);
        patiently(|| {
            push_summed(
                &placed.address,
                &placed.ticket,
                placed.id,
                bytes.clone(),
                checksum,
            )
        })
        .await?;
        self.record_put(&placed, checksum, false).await
    }

    /// Hands `file`, a memfd named [`placed.handover_name()`](PlacedPut::handover_name) and
    /// sealed against writes and size changes, holding the object's bytes, over to the placed
    /// worker, which copies it into its store (checked against `crc32c` when given); then has
    /// the head record the copy. Where the worker cannot take the file, its bytes are read
    /// back and streamed instead. `file` must stay open until this returns.
    #[cfg(target_os = "linux")]
    pub async fn put_placed_file(
        &self,
        placed: PlacedPut,
        file: &std::fs::File,
        crc32c: Option<u32>,
    ) -> Result<ObjectRef, ClientError> {
        let handed = patiently(|| {
            handover::hand_over(
                &placed.address,
                &placed.ticket,
                placed.id,
                file,
                placed.size,
                crc32c,
            )
        })
        .await;
        match handed {
            Ok(reply) => {
                tracing::debug!(object = %placed.id, size = placed.size, node = placed.node, "put handed over as a sealed file");
                self.record_put(&placed, reply.crc32c, true).await
            }
            Err(err) if handover::is_unusable(&err) => {
                tracing::debug!(object = %placed.id, %err, "put not handed over; streaming it");
                let bytes = read_file(file, placed.size)?;
                self.put_placed(placed, bytes).await
            }
            Err(err) => Err(err.into()),
        }
    }

    /// Has the head record the sealed copy of `placed` (whose CRC-32C is `checksum`), and
    /// returns the owner's reference.
    async fn record_put(
        &self,
        placed: &PlacedPut,
        checksum: u32,
        handed_over: bool,
    ) -> Result<ObjectRef, ClientError> {
        self.record_copy(placed.id, placed.size, checksum, placed.node, handed_over)
            .await
    }

    /// Has the head record a copy of object `id` (of this client's session) that a worker
    /// sealed on its own, an actor call's result kept in node `node`'s store (`actors.rs`),
    /// and returns the owner's reference.
    pub(crate) async fn record_kept(
        &self,
        id: ObjectId,
        size: u64,
        checksum: u32,
        node: u64,
    ) -> Result<ObjectRef, ClientError> {
        self.record_copy(id, size, checksum, node, false).await
    }

    /// Has the head record node `node`'s sealed copy of object `id` (`size` bytes whose CRC-32C
    /// is `checksum`), and returns the owner's reference; `handed_over`: the copy was handed
    /// over from this process's file (`Owned::handed_over`).
    async fn record_copy(
        &self,
        id: ObjectId,
        size: u64,
        checksum: u32,
        node: u64,
        handed_over: bool,
    ) -> Result<ObjectRef, ClientError> {
        let copy = wire::SealedObject {
            id: Some(id.into()),
            size,
            crc32c: checksum,
            node,
        };
        let reply = self
            .call(|mut rpc| {
                let request = wire::ObjectsSealedRequest {
                    copies: vec![copy],
                    namespace: self.namespace_text(),
                };
                async move { rpc.objects_sealed(request).await }
            })
            .await?;
        // From here the head holds the object: a failure below must still release it.
        let reference = ObjectRef::owning_copy(self, id, size, checksum, handed_over);
        if let Some(dropped) = reply.dropped.into_iter().next() {
            return Err(ClientError::ObjectUnavailable(format!(
                "object {id}: the head did not record its copy on node {node}: {}",
                dropped.reason
            )));
        }
        Ok(reference)
    }

    /// A new owning reference to object `id`, which this process did not put: a reference a
    /// task returned in its result (having [`disown`](ObjectRef::disown)ed it, or borrowed it
    /// from its own caller). Dropping its last clone releases the object, as for a `put`'s;
    /// adopt an id once per process (clone the ref, rather than adopt it again, as each adopted
    /// ref releases on its own). Its [`size`](ObjectRef::size) and
    /// [`checksum`](ObjectRef::checksum) read 0 (not known here; [`locate_object`] has them).
    ///
    /// [`locate_object`]: Self::locate_object
    pub fn adopt_object(&self, id: ObjectId) -> ObjectRef {
        ObjectRef::owning(self, id, 0, 0)
    }

    /// The bytes of object `id` (of this client's namespace): read from its holder's own
    /// sealed file, mapped read-only with no copy, when a holder runs on this machine (the
    /// mapping pins the object there while the `Bytes` live; `map.rs`), else fetched from the
    /// first of its holders that answers, checked whole against the length and CRC-32C the
    /// head recorded. An unknown id, one of another namespace, a freed or a lost object is
    /// refused with an error that names it (and, for a lost one, its last node and why).
    pub async fn get_object(&self, id: ObjectId) -> Result<Bytes, ClientError> {
        match self.read_object(id).await? {
            ObjectRead::Fetched(bytes) => Ok(bytes),
            #[cfg(target_os = "linux")]
            ObjectRead::Lent(lent) => lent.into_bytes().map_err(|e| {
                ClientError::ObjectUnavailable(format!("object {id}: cannot map its file: {e}"))
            }),
        }
    }

    /// Object `id` as [`get_object`](Self::get_object) reads it, before a lent file is
    /// mapped: for a caller that maps it itself (Python maps it as an `mmap`).
    pub async fn read_object(&self, id: ObjectId) -> Result<ObjectRead, ClientError> {
        let view = self.locate_object(id).await?;
        #[cfg(target_os = "linux")]
        for holder in &view.holders {
            let (Some(address), Some(ticket)) = (&holder.address, &holder.ticket) else {
                continue;
            };
            // An empty object has nothing to map.
            if view.size == 0 || !super::map::may_map(address) {
                continue;
            }
            match super::map::lend(address, ticket, id).await {
                Ok(lent) if lent.size == view.size => {
                    tracing::debug!(object = %id, node = %holder.node, "mapped its holder's file");
                    return Ok(ObjectRead::Lent(Box::new(lent)));
                }
                Ok(lent) => tracing::debug!(
                    object = %id,
                    node = %holder.node,
                    "the lent file holds {} bytes, not {}; fetching instead",
                    lent.size,
                    view.size
                ),
                Err(why) => tracing::debug!(
                    object = %id,
                    node = %holder.node,
                    %why,
                    "the holder's file was not lent; fetching instead"
                ),
            }
        }
        let mut failures = Vec::new();
        for holder in &view.holders {
            let (Some(address), Some(ticket)) = (&holder.address, &holder.ticket) else {
                failures.push(format!("node {}: no data-plane address", holder.node));
                continue;
            };
            match fetch_object(address, ticket, id).await {
                Ok(bytes) => {
                    let crc = crc32c::crc32c(&bytes);
                    if (bytes.len() as u64, crc) == (view.size, view.checksum) {
                        return Ok(ObjectRead::Fetched(bytes));
                    }
                    failures.push(format!(
                        "node {}: a copy of {} bytes with CRC-32C {crc:08x}, not {} bytes \
                         with {:08x}",
                        holder.node,
                        bytes.len(),
                        view.size,
                        view.checksum
                    ));
                }
                Err(err) => failures.push(format!("node {}: {err}", holder.node)),
            }
        }
        Err(ClientError::ObjectUnavailable(format!(
            "object {id}: no holder gave its bytes ({})",
            if failures.is_empty() {
                "it has no copy".to_string()
            } else {
                failures.join("; ")
            }
        )))
    }

    /// What the head knows of object `id`: its size, checksum, owner and copies (with a read
    /// ticket each).
    pub async fn locate_object(&self, id: ObjectId) -> Result<ObjectView, ClientError> {
        let reply = self
            .call(|mut rpc| {
                let request = self.read(wire::LocateObjectRequest {
                    id: Some(id.into()),
                    namespace: self.namespace_text(),
                });
                async move { rpc.locate_object(request).await }
            })
            .await?;
        Ok(ObjectView::try_from(reply)?)
    }

    /// The objects of this client's namespace (an admin's client without one: every
    /// namespace's), as `escher objects` lists them.
    pub async fn list_objects(&self) -> Result<Vec<ObjectView>, ClientError> {
        let reply = self
            .call(|mut rpc| {
                let request = self.read(wire::ListObjectsRequest {
                    namespace: self.namespace_text(),
                });
                async move { rpc.list_objects(request).await }
            })
            .await?;
        Ok(reply
            .objects
            .into_iter()
            .map(ObjectView::try_from)
            .collect::<Result<_, _>>()?)
    }

    /// Releases objects now (an [`ObjectRef`] dropped does this in the background): their
    /// copies are deleted. Returns the ids the head did not know in this namespace.
    pub async fn release_objects(&self, ids: &[ObjectId]) -> Result<Vec<ObjectId>, ClientError> {
        let keys: Vec<wire::ObjectKey> = ids.iter().map(|id| (*id).into()).collect();
        let reply = self
            .call(|mut rpc| {
                let request = wire::ReleaseObjectsRequest {
                    ids: keys.clone(),
                    namespace: self.namespace_text(),
                };
                async move { rpc.release_objects(request).await }
            })
            .await?;
        Ok(reply
            .unknown
            .into_iter()
            .map(|k| object_id(Some(k), "unknown"))
            .collect::<Result<_, _>>()?)
    }

    async fn place_object(
        &self,
        session: u64,
        index: u64,
        size: u64,
    ) -> Result<wire::PlaceObjectReply, ClientError> {
        self.call(|mut rpc| {
            let request = wire::PlaceObjectRequest {
                session,
                index,
                size,
                namespace: self.namespace_text(),
            };
            async move { rpc.place_object(request).await }
        })
        .await
    }

    pub(crate) fn namespace_text(&self) -> String {
        self.namespace()
            .map(|ns| ns.as_str().to_string())
            .unwrap_or_default()
    }
}

/// Tries `call` (a push or a handover) again, briefly, while the worker refuses it as not
/// ready: a worker that has just joined serves its data plane only once its own stream to the
/// head is attached (Unavailable until then).
async fn patiently<T, F, Fut>(mut call: F) -> Result<T, ObjectTransferError>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<T, ObjectTransferError>>,
{
    let mut pause = PUSH_PAUSE.0;
    let started = tokio::time::Instant::now();
    loop {
        match call().await {
            Err(err) if err.is_retryable() && started.elapsed() < PUSH_PATIENCE => {
                tokio::time::sleep(pause).await;
                pause = (pause * 2).min(PUSH_PAUSE.1);
            }
            done => return done,
        }
    }
}

/// The `size` bytes of `file` (a sealed memfd the worker did not take), to stream.
#[cfg(target_os = "linux")]
fn read_file(file: &std::fs::File, size: u64) -> Result<Bytes, ClientError> {
    use std::os::unix::fs::FileExt as _;
    let mut buffer = vec![0; size as usize];
    file.read_exact_at(&mut buffer, 0)
        .map_err(|e| ClientError::ObjectUnavailable(format!("cannot read the put's memfd: {e}")))?;
    Ok(Bytes::from(buffer))
}
