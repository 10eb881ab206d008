//! Object transfer on the data plane, the part both ends share: cutting an object into
//! `ObjectChunk`s ([`Chunks`]) and checking a stream of them as it arrives ([`ChunkReader`]),
//! for the worker's `Objects` service, its fetcher into the local store, and the client's
//! `fetch_object` / `push_object` (docs/ARCHITECTURE.md "Objects").
//!
//! A stream is a header (the object, its whole length and whole CRC-32C; a push's ticket)
//! on its first message, then the bytes in order, each message with the CRC-32C of its own
//! bytes. A reader refuses, naming the object, a chunk whose checksum does not match, a chunk
//! out of place or past the end, and a stream that ends before the object's length; the whole
//! object's checksum is checked as the bytes arrive. What the bytes go into (a store's
//! `ObjectWriter`, a client's buffer) is the caller's; nothing here does I/O.
//!
//! The sizes ([`CHUNK_BYTES`], [`STREAM_WINDOW_BYTES`], [`CONNECTION_WINDOW_BYTES`]) were
//! chosen by measuring (docs/ARCHITECTURE.md, "Objects", has the numbers and the command).

use bytes::Bytes;

use crate::types::ObjectId;
use crate::wire;

/// The bytes in one chunk a sender cuts.
pub const CHUNK_BYTES: usize = 1 << 20;

/// The largest chunk a reader takes (a sender of another build may cut larger ones than
/// [`CHUNK_BYTES`]).
pub const MAX_CHUNK_BYTES: usize = 4 << 20;

/// The largest message on the `Objects` service: a largest chunk and its header (with a
/// ticket naming many objects).
pub const MAX_MESSAGE_BYTES: usize = MAX_CHUNK_BYTES + (1 << 20);

/// The HTTP/2 stream window of a data-plane connection, raised from the 64 KiB default so
/// that one stream keeps a loopback or LAN link busy.
pub const STREAM_WINDOW_BYTES: u32 = 16 << 20;

/// The HTTP/2 connection window (several fetches share one connection).
pub const CONNECTION_WINDOW_BYTES: u32 = 64 << 20;

/// The name a client gives the memfd it hands object `id` over in (`Objects.Handover`):
/// `escher-put-OWNER.INDEX-NONCE`, the nonce the first 16 hex digits of the signature of the
/// write `ticket` the head gave it for the object. The holder checks the file it opened by
/// this name, so that only a file made for this object by a bearer of this ticket is taken.
/// `None` when `ticket` is not an object ticket's text.
pub fn handover_name(ticket: &str, id: ObjectId) -> Option<String> {
    // `o1.NODE.ACCESS.EXPIRY.OBJECTS.MAC[.NAMESPACE]` (types/object_ticket.rs).
    let mac = ticket.split('.').nth(5)?;
    let nonce = mac.get(..16)?;
    nonce
        .bytes()
        .all(|b| b.is_ascii_hexdigit())
        .then(|| format!("escher-put-{}.{}-{nonce}", id.owner(), id.index()))
}

/// An object's identity on the wire: what a stream's header says of the whole.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ObjectMeta {
    /// The object.
    pub id: ObjectId,
    /// Its length in bytes.
    pub size: u64,
    /// The CRC-32C of all of its bytes.
    pub crc32c: u32,
}

impl ObjectMeta {
    /// The header that opens a stream of this object, with `ticket` (a push's; empty in a
    /// fetch).
    pub fn header(&self, ticket: String) -> wire::ObjectHeader {
        wire::ObjectHeader {
            owner: self.id.owner(),
            index: self.id.index(),
            size: self.size,
            crc32c: self.crc32c,
            ticket,
        }
    }

    /// What `header` says.
    pub fn of(header: &wire::ObjectHeader) -> ObjectMeta {
        ObjectMeta {
            id: ObjectId(header.owner, header.index),
            size: header.size,
            crc32c: header.crc32c,
        }
    }
}

/// What is wrong with a stream of chunks. Each names the object.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum TransferError {
    /// The first message carries no header.
    #[error("the stream of object {id} did not start with its header (length and checksum)")]
    MissingHeader {
        /// The object expected.
        id: ObjectId,
    },
    /// A header past the first message.
    #[error("the stream of object {id} carried a second header at offset {offset}")]
    HeaderAgain {
        /// The object.
        id: ObjectId,
        /// Where it came.
        offset: u64,
    },
    /// The header names another object than the one asked for.
    #[error("asked for object {expected}, the holder sent object {got}")]
    WrongObject {
        /// The object asked for.
        expected: ObjectId,
        /// The object sent.
        got: ObjectId,
    },
    /// A holder says the object is another length or checksum than an earlier holder did
    /// (a transfer resumed from another holder).
    #[error(
        "holders disagree on object {id}: {size} bytes with CRC-32C {crc32c:#010x}, then \
         {other_size} bytes with CRC-32C {other_crc32c:#010x}"
    )]
    Disagree {
        /// The object.
        id: ObjectId,
        /// The length first said.
        size: u64,
        /// The checksum first said.
        crc32c: u32,
        /// The length now said.
        other_size: u64,
        /// The checksum now said.
        other_crc32c: u32,
    },
    /// A chunk that does not start where the last one ended.
    #[error("a chunk of object {id} starts at {got}, not at {expected} where the last one ended")]
    OutOfOrder {
        /// The object.
        id: ObjectId,
        /// Where it should start.
        expected: u64,
        /// Where it starts.
        got: u64,
    },
    /// A chunk that goes past the object's end, or is larger than a reader takes.
    #[error(
        "a chunk of object {id} of {len} bytes at offset {offset} goes past its {size} bytes or \
         the largest chunk"
    )]
    PastEnd {
        /// The object.
        id: ObjectId,
        /// Its length.
        size: u64,
        /// Where the chunk starts.
        offset: u64,
        /// Its length.
        len: u64,
    },
    /// A chunk whose bytes are not those its sender summed.
    #[error(
        "a chunk of object {id} ({len} bytes at offset {offset}) is corrupt: CRC-32C \
         {actual:#010x}, not the {expected:#010x} sent; nothing of it was kept"
    )]
    ChunkCorrupt {
        /// The object.
        id: ObjectId,
        /// Where the chunk starts.
        offset: u64,
        /// Its length.
        len: u64,
        /// The checksum sent with it.
        expected: u32,
        /// The checksum of what arrived.
        actual: u32,
    },
    /// The stream ended before the object did.
    #[error(
        "the stream of object {id} ended after {received} of its {size} bytes; nothing of it \
         was kept"
    )]
    Truncated {
        /// The object.
        id: ObjectId,
        /// Where the bytes stopped.
        received: u64,
        /// Its length.
        size: u64,
    },
    /// The whole object is not what its header vouched for.
    #[error(
        "object {id} is corrupt: its {size} bytes have CRC-32C {actual:#010x}, not the \
         {expected:#010x} its holder gave; nothing of it was kept"
    )]
    Corrupt {
        /// The object.
        id: ObjectId,
        /// Its length.
        size: u64,
        /// The checksum of the header.
        expected: u32,
        /// The checksum of the bytes.
        actual: u32,
    },
}

/// The chunks of an object's bytes from an offset on, the first carrying the header: what a
/// holder answers a fetch with, and what a push sends. Each chunk is a slice of `bytes` (no
/// copy) with its checksum, computed when the chunk is taken, so a stream that is read
/// slowly sums slowly.
#[derive(Debug)]
pub struct Chunks {
    bytes: Bytes,
    offset: u64,
    chunk: usize,
    header: Option<wire::ObjectHeader>,
    /// The checksums of the bytes' `chunk`-sized blocks, when known already.
    sums: Option<std::sync::Arc<[u32]>>,
}

impl Chunks {
    /// The chunks of `bytes` (the whole object, `meta.size` bytes) from `offset` on, `chunk`
    /// bytes each (the last shorter), the first message carrying `meta`'s header with
    /// `ticket`. An offset at or past the end gives the header alone.
    pub fn new(meta: ObjectMeta, bytes: Bytes, offset: u64, chunk: usize, ticket: String) -> Self {
        debug_assert_eq!(
            meta.size,
            bytes.len() as u64,
            "the header says the bytes' length"
        );
        Chunks {
            offset: offset.min(bytes.len() as u64),
            bytes,
            chunk: chunk.clamp(1, MAX_CHUNK_BYTES),
            header: Some(meta.header(ticket)),
            sums: None,
        }
    }

    /// Takes each chunk's checksum from `sums`, the CRC-32C of each `block`-byte block of the
    /// bytes (the last one shorter), instead of summing it, where the chunks are those blocks
    /// (the chunk size is `block` and the offset a multiple of it). Sums of another count
    /// than the blocks are not used.
    pub fn with_sums(mut self, sums: std::sync::Arc<[u32]>, block: usize) -> Self {
        let blocks = self.bytes.len().div_ceil(block);
        if block == self.chunk && sums.len() == blocks && self.offset.is_multiple_of(block as u64) {
            self.sums = Some(sums);
        }
        self
    }
}

impl Iterator for Chunks {
    type Item = wire::ObjectChunk;

    fn next(&mut self) -> Option<wire::ObjectChunk> {
        let len = self.bytes.len() as u64;
        let header = self.header.take();
        if header.is_none() && self.offset >= len {
            return None;
        }
        let start = self.offset as usize;
        let end = (start + self.chunk).min(len as usize);
        let data = self.bytes.slice(start..end);
        self.offset = end as u64;
        let known = self
            .sums
            .as_ref()
            .and_then(|sums| sums.get(start / self.chunk));
        let crc32c = match known {
            Some(&sum) if !data.is_empty() => sum,
            _ => crc32c::crc32c(&data),
        };
        Some(wire::ObjectChunk {
            header,
            offset: start as u64,
            crc32c,
            data,
        })
    }
}

/// Checks a stream of chunks as it arrives; see the module doc. Feed it each message in
/// turn ([`ChunkReader::accept`]), then [`ChunkReader::finish`] when the stream ends.
#[derive(Debug)]
pub struct ChunkReader {
    expected: Option<ObjectId>,
    meta: Option<ObjectMeta>,
    next: u64,
    /// The checksum of bytes `0..next`, when the stream started at 0.
    running: Option<u32>,
    /// Whether this stream's header was accepted.
    opened: bool,
}

/// What one accepted message brings.
#[derive(Debug)]
pub struct Piece {
    /// The object's header, on the first message.
    pub header: Option<ObjectMeta>,
    /// Where `data` goes in the object.
    pub offset: u64,
    /// The bytes, checked.
    pub data: Bytes,
    /// The CRC-32C of `data`, checked (0 for no bytes): a writer that sums what it writes
    /// need not sum it again.
    pub crc32c: u32,
}

impl ChunkReader {
    /// A reader of a stream that starts at `offset`, of object `expected` when the reader
    /// knows which (a fetch), of whatever the header names otherwise (a push).
    pub fn new(expected: Option<ObjectId>, offset: u64) -> ChunkReader {
        ChunkReader {
            expected,
            meta: None,
            next: offset,
            running: (offset == 0).then_some(0),
            opened: false,
        }
    }

    /// A reader that resumes object `meta`'s transfer at `offset` from another holder, whose
    /// header must agree with `meta`.
    pub fn resume(meta: ObjectMeta, offset: u64) -> ChunkReader {
        ChunkReader {
            expected: Some(meta.id),
            meta: Some(meta),
            next: offset,
            running: None,
            opened: false,
        }
    }

    /// The object, once a header named it.
    pub fn meta(&self) -> Option<ObjectMeta> {
        self.meta
    }

    /// The bytes accepted so far, counted from the start of the object: where a transfer
    /// broken off now would resume.
    pub fn received(&self) -> u64 {
        self.next
    }

    fn id(&self) -> ObjectId {
        self.meta
            .map(|m| m.id)
            .or(self.expected)
            .unwrap_or(ObjectId(0, 0))
    }

    /// Checks the next message of the stream.
    pub fn accept(&mut self, chunk: wire::ObjectChunk) -> Result<Piece, TransferError> {
        let header = match (chunk.header.as_ref().map(ObjectMeta::of), self.started()) {
            (Some(got), false) => Some(self.open(got)?),
            (None, false) => return Err(TransferError::MissingHeader { id: self.id() }),
            (Some(_), true) => {
                return Err(TransferError::HeaderAgain {
                    id: self.id(),
                    offset: chunk.offset,
                });
            }
            (None, true) => None,
        };
        let meta = self.meta.unwrap_or_else(|| unreachable!("opened above"));
        let len = chunk.data.len() as u64;
        if chunk.data.is_empty() {
            return Ok(Piece {
                header,
                offset: self.next,
                data: chunk.data,
                crc32c: 0,
            });
        }
        if chunk.offset != self.next {
            return Err(TransferError::OutOfOrder {
                id: meta.id,
                expected: self.next,
                got: chunk.offset,
            });
        }
        if chunk.data.len() > MAX_CHUNK_BYTES || chunk.offset.saturating_add(len) > meta.size {
            return Err(TransferError::PastEnd {
                id: meta.id,
                size: meta.size,
                offset: chunk.offset,
                len,
            });
        }
        let actual = crc32c::crc32c(&chunk.data);
        if actual != chunk.crc32c {
            return Err(TransferError::ChunkCorrupt {
                id: meta.id,
                offset: chunk.offset,
                len,
                expected: chunk.crc32c,
                actual,
            });
        }
        self.running = self
            .running
            .map(|crc| crc32c::crc32c_combine(crc, actual, len as usize));
        self.next += len;
        Ok(Piece {
            header,
            offset: chunk.offset,
            data: chunk.data,
            crc32c: actual,
        })
    }

    /// Whether a header was accepted on this stream.
    fn started(&self) -> bool {
        self.opened
    }

    /// Checks the stream's header against what is expected.
    fn open(&mut self, got: ObjectMeta) -> Result<ObjectMeta, TransferError> {
        if let Some(expected) = self.expected
            && expected != got.id
        {
            return Err(TransferError::WrongObject {
                expected,
                got: got.id,
            });
        }
        if let Some(meta) = self.meta
            && (meta.size, meta.crc32c) != (got.size, got.crc32c)
        {
            return Err(TransferError::Disagree {
                id: meta.id,
                size: meta.size,
                crc32c: meta.crc32c,
                other_size: got.size,
                other_crc32c: got.crc32c,
            });
        }
        if self.next > got.size {
            return Err(TransferError::PastEnd {
                id: got.id,
                size: got.size,
                offset: self.next,
                len: 0,
            });
        }
        self.meta = Some(got);
        self.opened = true;
        Ok(got)
    }

    /// Checks, at the end of the stream, that the whole object arrived, and (when the stream
    /// started at 0) that its checksum is the header's.
    pub fn finish(&self) -> Result<ObjectMeta, TransferError> {
        let Some(meta) = self.meta.filter(|_| self.opened) else {
            return Err(TransferError::MissingHeader { id: self.id() });
        };
        if self.next != meta.size {
            return Err(TransferError::Truncated {
                id: meta.id,
                received: self.next,
                size: meta.size,
            });
        }
        if let Some(actual) = self.running
            && actual != meta.crc32c
        {
            return Err(TransferError::Corrupt {
                id: meta.id,
                size: meta.size,
                expected: meta.crc32c,
                actual,
            });
        }
        Ok(meta)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn object(len: usize) -> (ObjectMeta, Bytes) {
        let bytes: Bytes = (0..len)
            .map(|i| (i * 7 % 251) as u8)
            .collect::<Vec<_>>()
            .into();
        let meta = ObjectMeta {
            id: ObjectId(9, 1),
            size: len as u64,
            crc32c: crc32c::crc32c(&bytes),
        };
        (meta, bytes)
    }

    /// Reads `chunks` whole with a fresh reader, returning the bytes.
    fn read(
        reader: &mut ChunkReader,
        chunks: impl IntoIterator<Item = wire::ObjectChunk>,
    ) -> Result<Vec<u8>, TransferError> {
        let mut out = Vec::new();
        for chunk in chunks {
            let piece = reader.accept(chunk)?;
            assert_eq!(piece.offset, out.len() as u64);
            out.extend_from_slice(&piece.data);
        }
        reader.finish()?;
        Ok(out)
    }

    #[test]
    fn chunks_read_back_whole_at_every_length() {
        for len in [0, 1, 999, 1000, 1001, 5000] {
            let (meta, bytes) = object(len);
            let chunks: Vec<_> = Chunks::new(meta, bytes.clone(), 0, 1000, "t".into()).collect();
            assert_eq!(chunks.len(), len.div_ceil(1000).max(1), "{len}");
            assert_eq!(chunks[0].header.as_ref().unwrap().ticket, "t");
            assert!(chunks[1..].iter().all(|c| c.header.is_none()));
            let mut reader = ChunkReader::new(Some(meta.id), 0);
            assert_eq!(read(&mut reader, chunks).unwrap(), bytes, "{len}");
            assert_eq!(reader.meta(), Some(meta));
        }
    }

    #[test]
    fn known_block_sums_are_sent_as_the_chunks_checksums() {
        let (meta, bytes) = object(2500);
        let sums: std::sync::Arc<[u32]> = bytes.chunks(1000).map(crc32c::crc32c).collect();
        let plain: Vec<_> = Chunks::new(meta, bytes.clone(), 0, 1000, String::new()).collect();
        let known: Vec<_> = Chunks::new(meta, bytes.clone(), 0, 1000, String::new())
            .with_sums(sums.clone(), 1000)
            .collect();
        assert_eq!(plain, known);
        // Used: a wrong sum given is sent (and a reader refuses it).
        let mut wrong = sums.to_vec();
        wrong[1] ^= 1;
        let sent: Vec<_> = Chunks::new(meta, bytes.clone(), 0, 1000, String::new())
            .with_sums(wrong.into(), 1000)
            .collect();
        assert_eq!(sent[1].crc32c, plain[1].crc32c ^ 1);
        // Not used where the chunks are not the blocks.
        for (offset, chunk, block) in [(500, 1000, 1000), (0, 500, 1000), (0, 1000, 500)] {
            let mut sums = sums.to_vec();
            sums.iter_mut().for_each(|s| *s ^= 1);
            let sent: Vec<_> = Chunks::new(meta, bytes.clone(), offset, chunk, String::new())
                .with_sums(sums.into(), block)
                .collect();
            let plain: Vec<_> =
                Chunks::new(meta, bytes.clone(), offset, chunk, String::new()).collect();
            assert_eq!(sent, plain, "{offset} {chunk} {block}");
        }
    }

    #[test]
    fn a_transfer_resumes_at_an_offset() {
        let (meta, bytes) = object(5000);
        let mut first = ChunkReader::new(Some(meta.id), 0);
        let mut got = Vec::new();
        for chunk in Chunks::new(meta, bytes.clone(), 0, 1000, String::new()).take(2) {
            got.extend_from_slice(&first.accept(chunk).unwrap().data);
        }
        assert!(matches!(
            first.finish(),
            Err(TransferError::Truncated {
                received: 2000,
                size: 5000,
                ..
            })
        ));
        let mut second = ChunkReader::resume(meta, first.received());
        for chunk in Chunks::new(meta, bytes.clone(), 2000, 1000, String::new()) {
            got.extend_from_slice(&second.accept(chunk).unwrap().data);
        }
        assert_eq!(second.finish().unwrap(), meta);
        assert_eq!(got, bytes);
        // A holder that says another checksum is refused.
        let other = ObjectMeta { crc32c: 1, ..meta };
        let mut third = ChunkReader::resume(meta, 2000);
        let chunk = Chunks::new(other, bytes, 2000, 1000, String::new())
            .next()
            .unwrap();
        assert!(matches!(
            third.accept(chunk),
            Err(TransferError::Disagree { .. })
        ));
    }

    #[test]
    fn bad_streams_are_refused_naming_the_object() {
        let (meta, bytes) = object(3000);
        let chunks =
            || Chunks::new(meta, bytes.clone(), 0, 1000, String::new()).collect::<Vec<_>>();
        let refuse = |chunks: Vec<wire::ObjectChunk>| {
            let e = read(&mut ChunkReader::new(Some(meta.id), 0), chunks).unwrap_err();
            assert!(e.to_string().contains("object 9.1"), "{e}");
            e
        };
        // A flipped bit.
        let mut c = chunks();
        let mut data = c[1].data.to_vec();
        data[10] ^= 1;
        c[1].data = data.into();
        assert!(matches!(
            refuse(c),
            TransferError::ChunkCorrupt { offset: 1000, .. }
        ));
        // A chunk and its checksum both changed: the whole object's checksum catches it.
        let mut c = chunks();
        let mut data = c[2].data.to_vec();
        data[0] ^= 1;
        c[2].crc32c = crc32c::crc32c(&data);
        c[2].data = data.into();
        assert!(matches!(refuse(c), TransferError::Corrupt { .. }));
        // Truncated, reordered, headerless, twice headed, past the end, another object.
        let mut c = chunks();
        c.pop();
        assert!(matches!(
            refuse(c),
            TransferError::Truncated { received: 2000, .. }
        ));
        let mut c = chunks();
        c.swap(1, 2);
        assert!(matches!(
            refuse(c),
            TransferError::OutOfOrder {
                expected: 1000,
                got: 2000,
                ..
            }
        ));
        let mut c = chunks();
        c[0].header = None;
        assert!(matches!(refuse(c), TransferError::MissingHeader { .. }));
        let mut c = chunks();
        c[1].header = c[0].header.clone();
        assert!(matches!(refuse(c), TransferError::HeaderAgain { .. }));
        let mut c = chunks();
        c[0].header.as_mut().unwrap().size = 2500;
        assert!(matches!(refuse(c), TransferError::PastEnd { .. }));
        assert!(matches!(
            refuse(vec![]),
            TransferError::MissingHeader { .. }
        ));
        let mut c = chunks();
        c[0].header.as_mut().unwrap().index = 2;
        let e = read(&mut ChunkReader::new(Some(meta.id), 0), c).unwrap_err();
        assert!(matches!(e, TransferError::WrongObject { .. }), "{e}");
    }
}
