//! The `Objects` service on the worker's data-plane listener: object bytes out of this node's
//! store (`Fetch`) and into it (`Push`), checked against the object ticket the head signed,
//! with no round trip (docs/ARCHITECTURE.md "Objects").
//!
//! - `Fetch` maps the object (pinned while the stream lives) and answers a header, then the
//!   object in [`CHUNK_BYTES`] slices of the mapping, each with its CRC-32C, from the offset
//!   asked on. The bytes are not copied before the encoder's.
//! - `Push` reserves the object's bytes when the first message names it (a push past the
//!   store's capacity is refused there, RESOURCE_EXHAUSTED, naming the object), writes each
//!   chunk once its checksum is checked, and seals the copy only when every byte came and the
//!   whole object's CRC-32C is the header's. A push refused or broken off leaves nothing.
//! - `Handover` takes a put from a client on this machine as the sealed memfd it wrote the
//!   object into (`handover.rs`): checked to be that file, sealed and of the object's size,
//!   then copied into the store and sealed as a push is. A file it cannot take is refused
//!   FAILED_PRECONDITION before anything is stored, and the client pushes instead.
//! - `Map` lends a reader on this machine the object's sealed file to map instead of fetching
//!   it (`lend.rs`): the ticket admitted as a fetch's, one grant naming the file by this
//!   process's pid and the descriptor, then the answer stays open, the object pinned, until
//!   the reader ends it. A reader of another machine is refused FAILED_PRECONDITION.
//!
//! A ticket must verify under this node's ticket key, name this node and the object, grant
//! read (fetch) or write (push) and be unexpired, else UNAUTHENTICATED; an object recorded in
//! another namespace than the ticket's is PERMISSION_DENIED.

use std::convert::Infallible;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use escher_proto::NodeId;
use escher_proto::object_stream;
use escher_proto::transfer::{
    CHUNK_BYTES, ChunkReader, Chunks, MAX_MESSAGE_BYTES, ObjectMeta, TransferError, handover_name,
};
use escher_proto::types::{ObjectAccess, ObjectTicket, TicketRefusal};
use escher_proto::wire::{
    self,
    objects_server::{Objects, ObjectsServer},
};
use tokio_stream::Stream;
use tokio_util::sync::CancellationToken;
use tonic::server::NamedService;
use tonic::{Request, Response, Status, Streaming};

use super::handover::{self, Handover, HandoverError};
use super::lend::{self, LendError, Lent};
use super::{NodeObjects, ObjectError, ObjectId};
use crate::actors::ActorHost;

/// The `Objects` service of one worker.
#[derive(Debug, Clone)]
pub struct ObjectService {
    objects: NodeObjects,
    keys: Keys,
    chunk: usize,
    /// Cancelled when the worker stops: ends the streams of lent files.
    stop: CancellationToken,
}

/// Where the node's id and ticket key come from.
#[derive(Debug, Clone)]
enum Keys {
    /// The worker's, once it attached to the head.
    Attached(Arc<ActorHost>),
    /// Given (a node of a benchmark or a test, with no head).
    Fixed(NodeId, [u8; 32]),
}

impl ObjectService {
    /// The service over `objects`, checking tickets with the key the worker attached with
    /// (which `keys` holds).
    pub(crate) fn new(objects: NodeObjects, keys: Arc<ActorHost>) -> ObjectService {
        ObjectService {
            objects,
            keys: Keys::Attached(keys),
            chunk: CHUNK_BYTES,
            stop: CancellationToken::new(),
        }
    }

    /// The service over `objects` as node `node`, checking tickets with `key` (the node's
    /// [`ticket_key`](escher_proto::types::ticket_key)): a data plane with no head, for
    /// benchmarks and tests.
    pub fn with_key(objects: NodeObjects, node: NodeId, key: [u8; 32]) -> ObjectService {
        ObjectService {
            objects,
            keys: Keys::Fixed(node, key),
            chunk: CHUNK_BYTES,
            stop: CancellationToken::new(),
        }
    }

    /// Ends the streams of files lent to readers (`Map`) when `stop` is cancelled.
    pub fn with_stop(mut self, stop: CancellationToken) -> ObjectService {
        self.stop = stop;
        self
    }

    /// Sends fetched objects in chunks of `bytes` (the chunk-size measurement's knob).
    pub fn with_chunk_bytes(mut self, bytes: usize) -> ObjectService {
        self.chunk = bytes;
        self
    }

    /// The ticket `text`, if it lets its bearer do `access` to object `id` here.
    fn admit(
        &self,
        text: &str,
        id: ObjectId,
        access: ObjectAccess,
    ) -> Result<ObjectTicket, Status> {
        let attached = match &self.keys {
            Keys::Attached(host) => host.key(),
            Keys::Fixed(node, key) => Some((*node, *key)),
        };
        let Some((node, key)) = attached else {
            return Err(Status::unavailable(
                "this worker is not attached to the head yet; try again shortly",
            ));
        };
        let refuse = |r: TicketRefusal| Status::unauthenticated(r.to_string());
        let ticket =
            ObjectTicket::verify(text, &key).ok_or_else(|| refuse(TicketRefusal::Invalid))?;
        ticket.allows(node, id, access, now_ms()).map_err(refuse)?;
        if let Some(recorded) = self.objects.namespace(id)
            && recorded != ticket.namespace
        {
            return Err(Status::permission_denied(
                TicketRefusal::OtherNamespace {
                    id,
                    ticket: ticket.namespace.clone().unwrap_or_else(|| "-".into()),
                }
                .to_string(),
            ));
        }
        Ok(ticket)
    }
}

impl ObjectService {
    /// The chunks that answer fetch `req`, once its ticket is admitted and the object mapped.
    async fn open_fetch(&self, req: wire::FetchRequest) -> Result<Chunks, Status> {
        let id = ObjectId(req.owner, req.index);
        self.admit(&req.ticket, id, ObjectAccess::Read)?;
        let store = self.objects.store().clone();
        let view = blocking(move || store.get(id)).await?;
        if req.offset > view.len() {
            return Err(Status::out_of_range(format!(
                "object {id} is {} bytes: a fetch from offset {} is past its end",
                view.len(),
                req.offset
            )));
        }
        let meta = ObjectMeta {
            id,
            size: view.len(),
            crc32c: view.crc32c(),
        };
        // The chunks are slices of the mapping, which they keep pinned until sent; their
        // checksums those its writer summed, when it did.
        let chunks = Chunks::new(meta, view.bytes(), req.offset, self.chunk, String::new());
        Ok(match view.block_sums() {
            Some(sums) => chunks.with_sums(sums, CHUNK_BYTES),
            None => chunks,
        })
    }

    /// The service as the data plane serves it: `Fetch` answered with no copy of the
    /// object's bytes ([`escher_proto::object_stream`]), `Push` by tonic.
    pub fn into_server(self) -> ObjectsPlane {
        ObjectsPlane {
            fetch: self.clone(),
            tonic: ObjectsServer::new(self)
                .max_decoding_message_size(MAX_MESSAGE_BYTES)
                .max_encoding_message_size(MAX_MESSAGE_BYTES),
        }
    }
}

/// The `Objects` service on the data plane's router; see [`ObjectService::into_server`].
#[derive(Debug, Clone)]
pub struct ObjectsPlane {
    fetch: ObjectService,
    tonic: ObjectsServer<ObjectService>,
}

impl NamedService for ObjectsPlane {
    const NAME: &'static str = <ObjectsServer<ObjectService> as NamedService>::NAME;
}

type PlaneFuture =
    Pin<Box<dyn Future<Output = Result<http::Response<tonic::body::Body>, Infallible>> + Send>>;

impl tonic::codegen::Service<http::Request<tonic::body::Body>> for ObjectsPlane {
    type Response = http::Response<tonic::body::Body>;
    type Error = Infallible;
    type Future = PlaneFuture;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, request: http::Request<tonic::body::Body>) -> PlaneFuture {
        if request.uri().path() != object_stream::FETCH_PATH {
            return self.tonic.call(request);
        }
        let service = self.fetch.clone();
        Box::pin(async move {
            let answer = match fetch_request(request.into_body()).await {
                Ok(req) => service.open_fetch(req).await,
                Err(status) => Err(status),
            };
            Ok(match answer {
                Ok(chunks) => object_stream::fetch_answer(chunks),
                Err(status) => status.into_http(),
            })
        })
    }
}

/// The one `FetchRequest` of a fetch's request body.
async fn fetch_request(mut body: tonic::body::Body) -> Result<wire::FetchRequest, Status> {
    use bytes::{Buf as _, BufMut as _};
    use tonic::codegen::Body as _;
    // A ticket and three numbers: a request larger than this is not a fetch.
    const LARGEST: usize = 64 << 10;
    let mut got = bytes::BytesMut::new();
    while let Some(frame) = std::future::poll_fn(|cx| Pin::new(&mut body).poll_frame(cx)).await {
        let frame = frame.map_err(|e| Status::internal(format!("the fetch request broke: {e}")))?;
        if let Ok(data) = frame.into_data() {
            if got.len() + data.len() > 5 + LARGEST {
                return Err(Status::out_of_range("a fetch request larger than 64 KiB"));
            }
            got.put(data);
        }
    }
    if got.len() < 5 || got[0] != 0 {
        return Err(Status::invalid_argument(
            "a fetch request is one uncompressed message",
        ));
    }
    let len = u32::from_be_bytes([got[1], got[2], got[3], got[4]]) as usize;
    got.advance(5);
    if got.len() != len {
        return Err(Status::invalid_argument(format!(
            "a fetch request of {} bytes says it is {len}",
            got.len()
        )));
    }
    <wire::FetchRequest as prost::Message>::decode(got.freeze())
        .map_err(|e| Status::invalid_argument(format!("a fetch request that does not decode: {e}")))
}

/// Milliseconds since the Unix epoch, this node's clock.
fn now_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

/// The status a store refusal is answered with; the message names the object.
pub(crate) fn object_status(e: ObjectError) -> Status {
    let text = e.to_string();
    match e {
        ObjectError::TooLarge { .. }
        | ObjectError::SpillDiskFull { .. }
        | ObjectError::MemoryDirFull { .. } => Status::resource_exhausted(text),
        ObjectError::Exists { .. } => Status::already_exists(text),
        ObjectError::NotFound { .. } => Status::not_found(text),
        ObjectError::OutOfBounds { .. } => Status::invalid_argument(text),
        ObjectError::Incomplete { .. } | ObjectError::ChecksumMismatch { .. } => {
            Status::data_loss(text)
        }
        ObjectError::Io { .. } => Status::internal(text),
    }
}

/// The status a bad stream of chunks is answered with; the message names the object.
pub(crate) fn transfer_status(e: TransferError) -> Status {
    let text = e.to_string();
    match e {
        TransferError::ChunkCorrupt { .. }
        | TransferError::Corrupt { .. }
        | TransferError::Truncated { .. } => Status::data_loss(text),
        _ => Status::invalid_argument(text),
    }
}

/// Runs blocking store work off the async threads.
async fn blocking<T: Send + 'static>(
    f: impl FnOnce() -> Result<T, ObjectError> + Send + 'static,
) -> Result<T, Status> {
    tokio::task::spawn_blocking(f)
        .await
        .map_err(|e| Status::internal(format!("the object store's call failed: {e}")))?
        .map_err(object_status)
}

type ChunkStream = Pin<Box<dyn Stream<Item = Result<wire::ObjectChunk, Status>> + Send>>;

/// The answer of `Map`: one grant, then open while the reader maps the file.
pub type LendStream = Pin<Box<dyn Stream<Item = Result<wire::MapGrant, Status>> + Send>>;

#[tonic::async_trait]
impl Objects for ObjectService {
    type FetchStream = ChunkStream;
    type MapStream = LendStream;

    #[tracing::instrument(skip_all, fields(object = %ObjectId(request.get_ref().owner, request.get_ref().index)))]
    async fn fetch(
        &self,
        request: Request<wire::FetchRequest>,
    ) -> Result<Response<ChunkStream>, Status> {
        let chunks = self.open_fetch(request.into_inner()).await?;
        Ok(Response::new(Box::pin(tokio_stream::iter(chunks.map(Ok)))))
    }

    #[tracing::instrument(skip_all)]
    async fn push(
        &self,
        request: Request<Streaming<wire::ObjectChunk>>,
    ) -> Result<Response<wire::PushReply>, Status> {
        let mut inbound = request.into_inner();
        let first = inbound.message().await?.ok_or_else(|| {
            Status::invalid_argument("the push ended before its first message named the object")
        })?;
        let header = first.header.as_ref().ok_or_else(|| {
            Status::invalid_argument(
                "the first message of a push names the object, its length and checksum, and \
                 carries its ticket",
            )
        })?;
        let meta = ObjectMeta::of(header);
        let id = meta.id;
        let ticket = self.admit(&header.ticket, id, ObjectAccess::Write)?;
        let store = self.objects.store().clone();
        let mut writer = blocking(move || store.create_streamed(id, meta.size)).await?;
        let mut reader = ChunkReader::new(Some(id), 0);
        let mut next = Some(first);
        loop {
            let chunk = match next.take() {
                Some(chunk) => chunk,
                None => match inbound.message().await {
                    Ok(Some(chunk)) => chunk,
                    Ok(None) => break,
                    // The writer is dropped: the partial copy goes.
                    Err(status) => {
                        return Err(Status::aborted(format!(
                            "the push of object {id} broke off after {} of its {} bytes: {}; \
                             nothing was kept",
                            reader.received(),
                            meta.size,
                            status.message()
                        )));
                    }
                },
            };
            let piece = reader.accept(chunk).map_err(transfer_status)?;
            // tmpfs pages: a memory copy, shorter than a hop to a blocking thread would be.
            writer
                .write_summed(piece.offset, &piece.data, piece.crc32c)
                .map_err(object_status)?;
        }
        reader.finish().map_err(transfer_status)?;
        let info = blocking(move || writer.seal(meta.crc32c)).await?;
        self.objects.record(id, ticket.namespace);
        tracing::debug!(object = %id, size = info.size, "pushed");
        Ok(Response::new(wire::PushReply {
            size: info.size,
            crc32c: info.crc32c,
        }))
    }

    #[tracing::instrument(skip_all, fields(object = %ObjectId(request.get_ref().owner, request.get_ref().index)))]
    async fn handover(
        &self,
        request: Request<wire::HandoverRequest>,
    ) -> Result<Response<wire::PushReply>, Status> {
        let req = request.into_inner();
        let id = ObjectId(req.owner, req.index);
        let ticket = self.admit(&req.ticket, id, ObjectAccess::Write)?;
        let name = handover_name(&req.ticket, id)
            .ok_or_else(|| Status::unauthenticated(TicketRefusal::Invalid.to_string()))?;
        let handover = Handover {
            id,
            pid: req.pid,
            fd: req.fd,
            size: req.size,
            boot_id: req.boot_id,
            name,
            crc32c: req.has_crc32c.then_some(req.crc32c),
        };
        let store = self.objects.store().clone();
        let taken = tokio::task::spawn_blocking(move || handover::take(&store, &handover))
            .await
            .map_err(|e| Status::internal(format!("the object store's call failed: {e}")))?;
        let info = match taken {
            Ok(info) => info,
            Err(HandoverError::Store(e)) => return Err(object_status(e)),
            Err(HandoverError::Refused(why)) => {
                tracing::debug!(object = %id, %why, "handover refused; the client pushes instead");
                return Err(Status::failed_precondition(format!(
                    "object {id}: the sealed file was not taken: {why}"
                )));
            }
        };
        self.objects.record(id, ticket.namespace);
        tracing::debug!(object = %id, size = info.size, pid = req.pid, "handed over as a sealed file");
        Ok(Response::new(wire::PushReply {
            size: info.size,
            crc32c: info.crc32c,
        }))
    }

    #[tracing::instrument(skip_all, fields(object = %ObjectId(request.get_ref().owner, request.get_ref().index)))]
    async fn map(
        &self,
        request: Request<wire::MapRequest>,
    ) -> Result<Response<LendStream>, Status> {
        let req = request.into_inner();
        let id = ObjectId(req.owner, req.index);
        self.admit(&req.ticket, id, ObjectAccess::Read)?;
        let store = self.objects.store().clone();
        let stop = self.stop.clone();
        let lent: Lent =
            match tokio::task::spawn_blocking(move || lend::lend(&store, id, &req.boot_id, stop))
                .await
                .map_err(|e| Status::internal(format!("the object store's call failed: {e}")))?
            {
                Ok(lent) => lent,
                Err(LendError::Store(e)) => return Err(object_status(e)),
                Err(LendError::Refused(why)) => {
                    return Err(Status::failed_precondition(format!(
                        "object {id}: its file is not lent: {why}; fetch it"
                    )));
                }
            };
        tracing::debug!(object = %id, "sealed file lent to a reader on this machine");
        Ok(Response::new(Box::pin(lent)))
    }
}
