//! `Objects.Fetch` on the wire with no copy of an object's bytes in user space: the holder's
//! answer is written, and the reader's stream read, by hand on HTTP/2 rather than through
//! tonic's codec (docs/ARCHITECTURE.md "Objects", "Fetch").
//!
//! It is the same gRPC: each `ObjectChunk` is a length-prefixed protobuf message, the stream
//! ends with `grpc-status` trailers, an error before the first chunk is a trailers-only
//! answer, and a reader or holder built on tonic reads or serves it unchanged. Only the copies
//! go: tonic's encoder copies every message into its buffer before the socket, and its decoder
//! copies every frame into its buffer before decoding. Here the holder sends each chunk as two
//! DATA frames, its prefix and fields (a few bytes) and the chunk itself, a slice of the mapped
//! object that hyper writes to the socket as it is ([`fetch_answer`]); the reader decodes each
//! message from the frames as they came, so a chunk that arrived in one frame is a slice of
//! that frame ([`FetchStream`]). A message cut across frames (a peer that frames otherwise) is
//! put together with one copy, as tonic would.

use std::collections::VecDeque;
use std::pin::Pin;
use std::task::{Context, Poll};

use bytes::{Buf, BufMut, Bytes, BytesMut};
use http_body::{Body as _, Frame};
use hyper::body::Incoming;
use prost::Message;
use tonic::{Code, Status};

use crate::data_channel::{DataChannel, chain};
use crate::transfer::Chunks;
use crate::wire;

/// The path of `Objects.Fetch`.
pub const FETCH_PATH: &str = "/escher.v1.Objects/Fetch";

/// The holder's answer to a fetch: `chunks` as a gRPC server stream (see the module doc).
pub fn fetch_answer(chunks: Chunks) -> http::Response<tonic::body::Body> {
    let body = ChunkBody {
        chunks,
        pending: None,
        done: false,
    };
    let mut response = http::Response::new(tonic::body::Body::new(body));
    response.headers_mut().insert(
        http::header::CONTENT_TYPE,
        http::HeaderValue::from_static("application/grpc"),
    );
    response
}

/// The frames of a fetch's answer: per chunk its prefix and fields, then its bytes; then the
/// `grpc-status: 0` trailers.
struct ChunkBody {
    chunks: Chunks,
    /// The bytes of the chunk whose prefix was just sent.
    pending: Option<Bytes>,
    done: bool,
}

impl http_body::Body for ChunkBody {
    type Data = Bytes;
    type Error = std::convert::Infallible;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        _cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Self::Error>>> {
        if let Some(data) = self.pending.take() {
            return Poll::Ready(Some(Ok(Frame::data(data))));
        }
        if self.done {
            return Poll::Ready(None);
        }
        let Some(mut chunk) = self.chunks.next() else {
            self.done = true;
            let mut trailers = http::HeaderMap::new();
            trailers.insert("grpc-status", http::HeaderValue::from_static("0"));
            return Poll::Ready(Some(Ok(Frame::trailers(trailers))));
        };
        let data = std::mem::take(&mut chunk.data);
        let head = prefix(&chunk, &data);
        if !data.is_empty() {
            self.pending = Some(data);
        }
        Poll::Ready(Some(Ok(Frame::data(head))))
    }

    fn is_end_stream(&self) -> bool {
        self.done && self.pending.is_none()
    }
}

/// The gRPC prefix and the protobuf fields of `chunk` (its data left empty) followed by the
/// key and length of `data`: everything of the message but `data` itself, which follows.
fn prefix(chunk: &wire::ObjectChunk, data: &Bytes) -> Bytes {
    let fields = chunk.encoded_len();
    let data_key =
        prost::encoding::key_len(3) + prost::encoding::encoded_len_varint(data.len() as u64);
    let message = fields
        + if data.is_empty() {
            0
        } else {
            data_key + data.len()
        };
    let mut out = BytesMut::with_capacity(5 + fields + data_key);
    out.put_u8(0);
    out.put_u32(u32::try_from(message).unwrap_or(u32::MAX));
    chunk
        .encode(&mut out)
        .unwrap_or_else(|_| unreachable!("the buffer was made large enough"));
    if !data.is_empty() {
        prost::encoding::encode_key(3, prost::encoding::WireType::LengthDelimited, &mut out);
        prost::encoding::encode_varint(data.len() as u64, &mut out);
    }
    out.freeze()
}

/// Asks the holder on `channel` for `request`'s object; the answer's chunks as they come.
/// A refusal (a bad ticket, an object not there) is the holder's status.
pub async fn fetch(
    channel: &mut DataChannel,
    request: &wire::FetchRequest,
    max_message: usize,
) -> Result<FetchStream, Status> {
    let mut body = BytesMut::with_capacity(5 + request.encoded_len());
    body.put_u8(0);
    body.put_u32(request.encoded_len() as u32);
    request
        .encode(&mut body)
        .unwrap_or_else(|_| unreachable!("the buffer was made large enough"));
    let uri = format!(
        "{}{FETCH_PATH}",
        channel.origin().to_string().trim_end_matches('/')
    );
    let http_request = http::Request::builder()
        .method(http::Method::POST)
        .uri(uri)
        .header(http::header::CONTENT_TYPE, "application/grpc")
        .header(http::header::TE, "trailers")
        .body(tonic::body::Body::new(http_body_full(body.freeze())))
        .map_err(|e| Status::internal(format!("cannot make the fetch request: {e}")))?;
    std::future::poll_fn(|cx| tower::Service::poll_ready(channel, cx))
        .await
        .map_err(|e| Status::unavailable(format!("the holder's connection failed: {e}")))?;
    let response = tower::Service::call(channel, http_request)
        .await
        .map_err(|e| Status::unavailable(format!("the fetch request failed: {e}")))?;
    let (parts, body) = response.into_parts();
    if parts.status != http::StatusCode::OK {
        return Err(Status::unknown(format!(
            "the holder answered HTTP status {}",
            parts.status
        )));
    }
    // A trailers-only answer: the holder refused.
    if let Some(status) = Status::from_header_map(&parts.headers)
        && status.code() != Code::Ok
    {
        return Err(status);
    }
    Ok(FetchStream {
        body,
        frames: Rope::default(),
        max_message,
        ended: false,
    })
}

/// One body of `bytes`, then its end.
fn http_body_full(
    bytes: Bytes,
) -> impl http_body::Body<Data = Bytes, Error = std::convert::Infallible> {
    struct Full(Option<Bytes>);
    impl http_body::Body for Full {
        type Data = Bytes;
        type Error = std::convert::Infallible;
        fn poll_frame(
            mut self: Pin<&mut Self>,
            _cx: &mut Context<'_>,
        ) -> Poll<Option<Result<Frame<Bytes>, Self::Error>>> {
            Poll::Ready(self.0.take().map(|b| Ok(Frame::data(b))))
        }
        fn is_end_stream(&self) -> bool {
            self.0.is_none()
        }
        fn size_hint(&self) -> http_body::SizeHint {
            http_body::SizeHint::with_exact(self.0.as_ref().map_or(0, |b| b.len() as u64))
        }
    }
    Full(Some(bytes))
}

/// A fetch's chunks as they arrive; [`FetchStream::message`] as tonic's `Streaming`.
#[derive(Debug)]
pub struct FetchStream {
    body: Incoming,
    frames: Rope,
    max_message: usize,
    ended: bool,
}

impl FetchStream {
    /// The next chunk, `None` when the stream ended well, or the status it ended with (the
    /// holder's, or a broken connection's).
    pub async fn message(&mut self) -> Result<Option<wire::ObjectChunk>, Status> {
        loop {
            if let Some(chunk) = self.decode()? {
                return Ok(Some(chunk));
            }
            if self.ended {
                return Ok(None);
            }
            let frame = std::future::poll_fn(|cx| Pin::new(&mut self.body).poll_frame(cx)).await;
            match frame {
                Some(Ok(frame)) => match frame.into_data() {
                    Ok(data) => self.frames.push(data),
                    Err(frame) => {
                        let trailers = frame.into_trailers().unwrap_or_default();
                        return self.end(Status::from_header_map(&trailers));
                    }
                },
                Some(Err(e)) => {
                    return Err(Status::unavailable(format!(
                        "the stream broke: {}",
                        chain(&e)
                    )));
                }
                None => return self.end(None),
            }
        }
    }

    /// The stream's end with `status` from its trailers.
    fn end(&mut self, status: Option<Status>) -> Result<Option<wire::ObjectChunk>, Status> {
        self.ended = true;
        match status {
            Some(status) if status.code() == Code::Ok => {}
            Some(status) => return Err(status),
            None => {
                return Err(Status::internal(
                    "the stream ended without its grpc-status trailers",
                ));
            }
        }
        if self.frames.remaining() > 0 {
            return Err(Status::internal(format!(
                "the stream ended inside a message ({} bytes of it)",
                self.frames.remaining()
            )));
        }
        Ok(None)
    }

    /// The next whole message among the frames received, if one is there.
    fn decode(&mut self) -> Result<Option<wire::ObjectChunk>, Status> {
        let mut head = [0u8; 5];
        if !self.frames.peek(&mut head) {
            return Ok(None);
        }
        if head[0] != 0 {
            return Err(Status::internal(
                "the holder sent a compressed message, which a fetch does not ask for",
            ));
        }
        let len = u32::from_be_bytes([head[1], head[2], head[3], head[4]]) as usize;
        if len > self.max_message {
            return Err(Status::out_of_range(format!(
                "a message of {len} bytes is larger than the {} a fetch takes",
                self.max_message
            )));
        }
        if self.frames.remaining() < 5 + len {
            return Ok(None);
        }
        self.frames.advance(5);
        let message = (&mut self.frames).take(len);
        wire::ObjectChunk::decode(message)
            .map(Some)
            .map_err(|e| Status::internal(format!("a chunk could not be decoded: {e}")))
    }
}

/// The frames received and not decoded yet, read as one buffer: a slice within one frame is
/// taken with no copy.
#[derive(Debug, Default)]
struct Rope {
    frames: VecDeque<Bytes>,
    len: usize,
}

impl Rope {
    fn push(&mut self, frame: Bytes) {
        if !frame.is_empty() {
            self.len += frame.len();
            self.frames.push_back(frame);
        }
    }

    /// Copies the first `out.len()` bytes into `out` without taking them; false when fewer
    /// are here.
    fn peek(&self, out: &mut [u8]) -> bool {
        if self.len < out.len() {
            return false;
        }
        let mut at = 0;
        for frame in &self.frames {
            let n = frame.len().min(out.len() - at);
            out[at..at + n].copy_from_slice(&frame[..n]);
            at += n;
            if at == out.len() {
                break;
            }
        }
        true
    }
}

impl Buf for Rope {
    fn remaining(&self) -> usize {
        self.len
    }

    fn chunk(&self) -> &[u8] {
        self.frames.front().map_or(&[], |f| &f[..])
    }

    fn advance(&mut self, mut cnt: usize) {
        assert!(cnt <= self.len, "advanced past the frames received");
        self.len -= cnt;
        while cnt > 0 {
            let front = self
                .frames
                .front_mut()
                .unwrap_or_else(|| unreachable!("the length counts the frames"));
            if cnt < front.len() {
                front.advance(cnt);
                return;
            }
            cnt -= front.len();
            self.frames.pop_front();
        }
    }

    fn copy_to_bytes(&mut self, len: usize) -> Bytes {
        assert!(len <= self.len, "took past the frames received");
        match self.frames.front_mut() {
            Some(front) if front.len() >= len => {
                let out = front.split_to(len);
                if front.is_empty() {
                    self.frames.pop_front();
                }
                self.len -= len;
                out
            }
            _ => {
                let mut out = BytesMut::with_capacity(len);
                out.put((&mut *self).take(len));
                out.freeze()
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::transfer::{ChunkReader, ObjectMeta};
    use crate::types::ObjectId;

    fn object(len: usize) -> (ObjectMeta, Bytes) {
        let bytes: Bytes = (0..len)
            .map(|i| (i * 13 % 251) as u8)
            .collect::<Vec<_>>()
            .into();
        let meta = ObjectMeta {
            id: ObjectId(4, 2),
            size: len as u64,
            crc32c: crc32c::crc32c(&bytes),
        };
        (meta, bytes)
    }

    /// The frames a holder sends for `bytes` in chunks of `chunk`, data frames only.
    fn frames(meta: ObjectMeta, bytes: &Bytes, chunk: usize) -> Vec<Bytes> {
        let mut body = ChunkBody {
            chunks: Chunks::new(meta, bytes.clone(), 0, chunk, String::new()),
            pending: None,
            done: false,
        };
        let waker = std::task::Waker::noop();
        let mut cx = Context::from_waker(waker);
        let mut out = Vec::new();
        while let Poll::Ready(Some(Ok(frame))) = Pin::new(&mut body).poll_frame(&mut cx) {
            match frame.into_data() {
                Ok(data) => out.push(data),
                Err(trailers) => {
                    let trailers = trailers.into_trailers().unwrap();
                    assert_eq!(trailers["grpc-status"], "0");
                }
            }
        }
        assert!(body.is_end_stream());
        out
    }

    fn stream_of(frames: Rope) -> Vec<wire::ObjectChunk> {
        let mut stream = Decoder(frames);
        let mut out = Vec::new();
        while let Some(chunk) = stream.next() {
            out.push(chunk);
        }
        assert_eq!(stream.0.remaining(), 0);
        out
    }

    /// [`FetchStream::decode`] without a connection.
    struct Decoder(Rope);

    impl Decoder {
        fn next(&mut self) -> Option<wire::ObjectChunk> {
            let mut head = [0u8; 5];
            if !self.0.peek(&mut head) {
                return None;
            }
            let len = u32::from_be_bytes([head[1], head[2], head[3], head[4]]) as usize;
            assert!(self.0.remaining() >= 5 + len);
            self.0.advance(5);
            Some(wire::ObjectChunk::decode((&mut self.0).take(len)).unwrap())
        }
    }

    #[test]
    fn the_frames_are_the_messages_tonic_would_send() {
        for len in [0, 1, 999, 1000, 4321] {
            let (meta, bytes) = object(len);
            // What prost encodes, with tonic's prefix, message by message.
            let mut expected = BytesMut::new();
            for chunk in Chunks::new(meta, bytes.clone(), 0, 1000, String::new()) {
                expected.put_u8(0);
                expected.put_u32(chunk.encoded_len() as u32);
                chunk.encode(&mut expected).unwrap();
            }
            let sent: Vec<u8> = frames(meta, &bytes, 1000).concat();
            let mut decoded = Rope::default();
            decoded.push(Bytes::from(sent.clone()));
            let mut by_prost = Rope::default();
            by_prost.push(expected.freeze());
            // The same messages (the fields in another order is still the same message).
            assert_eq!(stream_of(decoded), stream_of(by_prost), "{len}");
        }
    }

    #[test]
    fn a_chunk_in_one_frame_is_read_without_a_copy_and_any_framing_reads_back_whole() {
        let (meta, bytes) = object(5000);
        let sent = frames(meta, &bytes, 1000);
        // As sent: each chunk's bytes are a slice of its frame (the object's own bytes).
        let mut rope = Rope::default();
        for frame in &sent {
            rope.push(frame.clone());
        }
        let chunks = stream_of(rope);
        let mut reader = ChunkReader::new(Some(meta.id), 0);
        for chunk in chunks {
            let piece = reader.accept(chunk).unwrap();
            if !piece.data.is_empty() {
                let at = piece.data.as_ptr() as usize - bytes.as_ptr() as usize;
                assert_eq!(at as u64, piece.offset, "a slice of the object itself");
            }
        }
        assert_eq!(reader.finish().unwrap(), meta);
        // Cut anywhere (one byte at a time, or frames of 7): the same bytes.
        let all: Vec<u8> = sent.concat();
        for cut in [1, 7, 1003] {
            let mut rope = Rope::default();
            for piece in all.chunks(cut) {
                rope.push(Bytes::copy_from_slice(piece));
            }
            let mut reader = ChunkReader::new(Some(meta.id), 0);
            let mut got = Vec::new();
            for chunk in stream_of(rope) {
                got.extend_from_slice(&reader.accept(chunk).unwrap().data);
            }
            assert_eq!(reader.finish().unwrap(), meta);
            assert_eq!(got, bytes, "cut {cut}");
        }
    }
}
