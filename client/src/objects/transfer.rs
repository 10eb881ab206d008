//! [`fetch_object`] and [`push_object`]: an object's bytes between this client and a worker's
//! data plane (`Objects.Fetch`, `Objects.Push`), in chunks that carry their own CRC-32C.
//!
//! The chunking and every check of a stream (each chunk's checksum, order, the whole length
//! and checksum) are `escher_proto::transfer`'s, the same code the worker's service and its
//! fetcher run. A fetch returns the object only whole and checked; a push is sealed by the
//! worker only whole and checked, and nothing of a refused or broken push is kept there.

use bytes::{Bytes, BytesMut};
use escher_proto::data_channel::{self, DataChannel};
use escher_proto::transfer::{
    CHUNK_BYTES, ChunkReader, Chunks, MAX_MESSAGE_BYTES, ObjectMeta, TransferError,
};
use escher_proto::types::ObjectId;
use escher_proto::wire::{self, objects_client::ObjectsClient};
use std::time::Duration;
use tonic::Code;

/// How long a connection to a worker's data plane may take.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(3);

/// Why an object's bytes did not move. Each names the object and the worker's address.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ObjectTransferError {
    /// The worker's data plane could not be reached.
    #[error("object {id}: cannot reach the worker's data plane at {address}: {cause}")]
    Unreachable {
        /// The object.
        id: ObjectId,
        /// The data-plane address.
        address: String,
        /// What the transport said.
        cause: String,
    },
    /// The worker refused the call: an invalid or expired ticket, an object it does not hold,
    /// a push past its store's capacity, an object it has already.
    #[error("object {id}: the worker at {address} refused: {}", .status.message())]
    Refused {
        /// The object.
        id: ObjectId,
        /// The data-plane address.
        address: String,
        /// Its answer (the code says which refusal).
        status: tonic::Status,
    },
    /// The transfer broke off (the worker went away, the connection dropped).
    #[error("object {id}: the transfer from {address} broke off after {received} bytes: {}", .status.message())]
    BrokenOff {
        /// The object.
        id: ObjectId,
        /// The data-plane address.
        address: String,
        /// The bytes that had arrived (none of them kept).
        received: u64,
        /// What the transport said.
        status: tonic::Status,
    },
    /// The bytes that arrived are not the object (a corrupt chunk, a short stream, another
    /// object); nothing of them is returned.
    #[error("from {address}: {source}")]
    Stream {
        /// The data-plane address.
        address: String,
        /// What was wrong with them.
        #[source]
        source: TransferError,
    },
}

impl ObjectTransferError {
    /// Whether the same call may succeed if tried again (the worker was unreachable, the
    /// transfer broke off, or the worker was short of room or not attached yet).
    pub fn is_retryable(&self) -> bool {
        match self {
            ObjectTransferError::Unreachable { .. } | ObjectTransferError::BrokenOff { .. } => true,
            ObjectTransferError::Refused { status, .. } => matches!(
                status.code(),
                Code::Unavailable | Code::ResourceExhausted | Code::Aborted
            ),
            ObjectTransferError::Stream { .. } => false,
        }
    }

    /// The gRPC code of the worker's refusal, if it refused.
    pub fn code(&self) -> Option<Code> {
        match self {
            ObjectTransferError::Refused { status, .. } => Some(status.code()),
            _ => None,
        }
    }
}

/// A client of the `Objects` service at `address` (`HOST:PORT`), on a channel with raised
/// HTTP/2 windows and large frames (`escher_proto::data_channel`).
pub(super) async fn connect(
    id: ObjectId,
    address: &str,
) -> Result<ObjectsClient<DataChannel>, ObjectTransferError> {
    let channel = data_channel::connect(address, CONNECT_TIMEOUT)
        .await
        .map_err(|e| ObjectTransferError::Unreachable {
            id,
            address: address.to_string(),
            cause: e.to_string(),
        })?;
    let origin = channel.origin();
    Ok(ObjectsClient::with_origin(channel, origin)
        .max_decoding_message_size(MAX_MESSAGE_BYTES)
        .max_encoding_message_size(MAX_MESSAGE_BYTES))
}

/// Object `id`'s bytes from the worker whose data plane is at `address`, with `ticket` (an
/// object ticket with read access, signed for that worker's node). Returned only whole, with
/// its length and CRC-32C checked, in one buffer.
pub async fn fetch_object(
    address: &str,
    ticket: &str,
    id: ObjectId,
) -> Result<Bytes, ObjectTransferError> {
    let mut rpc = connect(id, address).await?;
    let request = wire::FetchRequest {
        ticket: ticket.to_string(),
        owner: id.owner(),
        index: id.index(),
        offset: 0,
    };
    let refused = |status| ObjectTransferError::Refused {
        id,
        address: address.to_string(),
        status,
    };
    let mut stream = rpc.fetch(request).await.map_err(refused)?.into_inner();
    let mut reader = ChunkReader::new(Some(id), 0);
    let mut buffer = BytesMut::new();
    loop {
        let chunk = match stream.message().await {
            Ok(Some(chunk)) => chunk,
            Ok(None) => break,
            Err(status) => {
                return Err(ObjectTransferError::BrokenOff {
                    id,
                    address: address.to_string(),
                    received: reader.received(),
                    status,
                });
            }
        };
        let piece = reader
            .accept(chunk)
            .map_err(|source| ObjectTransferError::Stream {
                address: address.to_string(),
                source,
            })?;
        if let Some(meta) = piece.header {
            // One allocation for the whole object; a header's length is checked by the
            // chunks that must fill it, not trusted for more than a reservation.
            buffer.reserve(meta.size.min(1 << 30) as usize);
        }
        buffer.extend_from_slice(&piece.data);
    }
    reader
        .finish()
        .map_err(|source| ObjectTransferError::Stream {
            address: address.to_string(),
            source,
        })?;
    Ok(buffer.freeze())
}

/// Uploads `bytes` as object `id` into the store of the worker whose data plane is at
/// `address`, with `ticket` (an object ticket with write access, signed for that worker's
/// node). Returns when the worker has sealed the copy whole and checked; a refusal (no room:
/// [`tonic::Code::ResourceExhausted`]; the object there already: `AlreadyExists`) leaves
/// nothing behind.
pub async fn push_object(
    address: &str,
    ticket: &str,
    id: ObjectId,
    bytes: Bytes,
) -> Result<(), ObjectTransferError> {
    let crc32c = crc32c::crc32c(&bytes);
    push_summed(address, ticket, id, bytes, crc32c).await
}

/// [`push_object`] of `bytes` whose CRC-32C the caller has computed already (a `put`, which
/// reports it to the head too), so that they are summed once less. A wrong sum is refused by
/// the worker's check of the whole object, and nothing is kept.
pub(crate) async fn push_summed(
    address: &str,
    ticket: &str,
    id: ObjectId,
    bytes: Bytes,
    crc32c: u32,
) -> Result<(), ObjectTransferError> {
    let mut rpc = connect(id, address).await?;
    let meta = ObjectMeta {
        id,
        size: bytes.len() as u64,
        crc32c,
    };
    let chunks = Chunks::new(meta, bytes, 0, CHUNK_BYTES, ticket.to_string());
    let reply = rpc
        .push(tokio_stream::iter(chunks))
        .await
        .map_err(|status| ObjectTransferError::Refused {
            id,
            address: address.to_string(),
            status,
        })?
        .into_inner();
    if (reply.size, reply.crc32c) != (meta.size, meta.crc32c) {
        return Err(ObjectTransferError::Stream {
            address: address.to_string(),
            source: TransferError::Corrupt {
                id,
                size: meta.size,
                expected: meta.crc32c,
                actual: reply.crc32c,
            },
        });
    }
    Ok(())
}
