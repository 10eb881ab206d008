//! The data plane's transfer tests: real `Objects` services (the worker's own) on loopback
//! tonic servers in this process, each over a real store on `/dev/shm`, driven by the
//! client's `fetch_object` / `push_object` and by the worker's fetcher. A holder that goes
//! away or corrupts a chunk is the real service behind a wrapper that breaks its stream.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use bytes::Bytes;
use escher_client::objects::{ObjectTransferError, fetch_object as client_fetch, push_object};
use escher_proto::NodeId;
use escher_proto::transfer::{
    CONNECTION_WINDOW_BYTES, Chunks, MAX_MESSAGE_BYTES, ObjectMeta, STREAM_WINDOW_BYTES,
};
use escher_proto::types::{ObjectAccess, ObjectTicket, ticket_key};
use escher_proto::wire::{self, objects_client::ObjectsClient, objects_server::Objects};
use sha2::Digest as _;
use tokio_stream::StreamExt as _;
use tonic::{Code, Request, Response, Status, Streaming};

use super::*;
use crate::actors::ActorHost;

const MIB: usize = 1 << 20;

/// One node: a store, the key its tickets are signed with, and its `Objects` service on a
/// loopback port.
struct Node {
    id: NodeId,
    objects: NodeObjects,
    key: [u8; 32],
    address: String,
    server: tokio::task::JoinHandle<()>,
    sent: Arc<AtomicU64>,
    _memory_root: tempfile::TempDir,
    _spill_root: tempfile::TempDir,
}

/// How a node's service misbehaves.
#[derive(Clone, Copy)]
enum Fault {
    None,
    /// Fetch streams end with an error after this many chunks (the holder went away).
    GoneAfter(usize),
    /// Chunk `n` of each fetch stream has a bit flipped after its checksum was computed.
    Corrupt(usize),
    /// None, and served as the worker's data plane serves it (`ObjectService::into_server`:
    /// `Fetch` written by hand, not by tonic's encoder); `sent` is not counted.
    Plane,
}

/// The worker's service, broken as `fault` says.
struct Faulty {
    inner: ObjectService,
    fault: Fault,
    /// The object bytes its fetch streams have sent.
    sent: Arc<AtomicU64>,
}

#[tonic::async_trait]
impl Objects for Faulty {
    type FetchStream = <ObjectService as Objects>::FetchStream;
    type MapStream = <ObjectService as Objects>::MapStream;

    async fn fetch(
        &self,
        request: Request<wire::FetchRequest>,
    ) -> Result<Response<Self::FetchStream>, Status> {
        let sent = Arc::clone(&self.sent);
        let stream = self.inner.fetch(request).await?.into_inner();
        let stream = Box::pin(stream.map(move |chunk| {
            if let Ok(chunk) = &chunk {
                sent.fetch_add(chunk.data.len() as u64, Ordering::Relaxed);
            }
            chunk
        }));
        let stream: Self::FetchStream = match self.fault {
            Fault::None | Fault::Plane => stream,
            Fault::GoneAfter(n) => Box::pin(stream.take(n).chain(tokio_stream::once(Err(
                Status::unavailable("the holder went away"),
            )))),
            Fault::Corrupt(n) => {
                let mut i = 0;
                Box::pin(stream.map(move |chunk| {
                    let mut chunk = chunk?;
                    i += 1;
                    if i - 1 == n && !chunk.data.is_empty() {
                        let mut data = chunk.data.to_vec();
                        data[0] ^= 0x20;
                        chunk.data = data.into();
                    }
                    Ok(chunk)
                }))
            }
        };
        Ok(Response::new(stream))
    }

    async fn push(
        &self,
        request: Request<Streaming<wire::ObjectChunk>>,
    ) -> Result<Response<wire::PushReply>, Status> {
        self.inner.push(request).await
    }

    async fn map(
        &self,
        request: Request<wire::MapRequest>,
    ) -> Result<Response<Self::MapStream>, Status> {
        self.inner.map(request).await
    }

    async fn handover(
        &self,
        request: Request<wire::HandoverRequest>,
    ) -> Result<Response<wire::PushReply>, Status> {
        self.inner.handover(request).await
    }
}

async fn node(n: u64, capacity: u64, fault: Fault) -> Node {
    let memory_root = tempfile::tempdir_in("/dev/shm").unwrap();
    let spill_root = tempfile::tempdir().unwrap();
    let store = ObjectStore::open(StoreConfig {
        capacity,
        memory_root: memory_root.path().to_path_buf(),
        spill_root: spill_root.path().to_path_buf(),
    })
    .unwrap();
    let objects = NodeObjects::new(store);
    let host = Arc::new(ActorHost::new(BTreeMap::new()));
    let secret = format!("secret-{n}");
    host.attached(NodeId(n), &secret);
    let key = ticket_key(&sha2::Sha256::digest(secret.as_bytes()).into());
    let sent = Arc::new(AtomicU64::new(0));
    let (objects_served, host_served) = (objects.clone(), Arc::clone(&host));
    let service = Faulty {
        sent: Arc::clone(&sent),
        inner: ObjectService::new(objects.clone(), host),
        fault,
    };
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let address = listener.local_addr().unwrap().to_string();
    let incoming = tokio_stream::wrappers::TcpListenerStream::new(listener);
    let server = tokio::spawn(async move {
        let builder = tonic::transport::Server::builder()
            .initial_stream_window_size(STREAM_WINDOW_BYTES)
            .initial_connection_window_size(CONNECTION_WINDOW_BYTES)
            .max_frame_size(escher_proto::data_channel::MAX_FRAME_BYTES);
        if matches!(fault, Fault::Plane) {
            let plane = ObjectService::new(objects_served, host_served).into_server();
            let mut builder = builder;
            builder
                .add_service(plane)
                .serve_with_incoming(incoming)
                .await
                .unwrap();
            return;
        }
        let mut builder = builder;
        builder
            .add_service(
                wire::objects_server::ObjectsServer::new(service)
                    .max_decoding_message_size(MAX_MESSAGE_BYTES)
                    .max_encoding_message_size(MAX_MESSAGE_BYTES),
            )
            .serve_with_incoming(incoming)
            .await
            .unwrap();
    });
    Node {
        id: NodeId(n),
        objects,
        key,
        address,
        server,
        sent,
        _memory_root: memory_root,
        _spill_root: spill_root,
    }
}

fn now_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis() as u64
}

impl Node {
    fn ticket(&self, access: ObjectAccess, id: ObjectId, namespace: Option<&str>) -> String {
        ObjectTicket {
            node: self.id,
            access,
            objects: vec![id],
            expiry_ms: now_ms() + 60_000,
            namespace: namespace.map(str::to_owned),
        }
        .sign(&self.key)
    }

    fn read(&self, id: ObjectId) -> String {
        self.ticket(ObjectAccess::Read, id, Some("ns"))
    }

    fn write(&self, id: ObjectId) -> String {
        self.ticket(ObjectAccess::Write, id, Some("ns"))
    }

    fn holder(&self, id: ObjectId) -> Holder {
        Holder {
            node: self.id,
            address: self.address.clone(),
            ticket: self.read(id),
        }
    }

    /// The store holds exactly these objects, and no partial file.
    fn holds(&self, ids: &[ObjectId]) {
        let store = self.objects.store();
        let listed: Vec<ObjectId> = store.list().iter().map(|s| s.info.id).collect();
        assert_eq!(listed, ids);
        let usage = store.usage();
        assert_eq!(usage.writing_bytes, 0, "{usage:?}");
        store.sanity_check().unwrap();
    }
}

fn data(size: usize, seed: u64) -> Bytes {
    let mut bytes = vec![0; size];
    fastrand::Rng::with_seed(seed).fill(&mut bytes);
    bytes.into()
}

/// A raw push of `chunks`, as a misbehaving client would send them.
async fn raw_push(
    address: &str,
    chunks: Vec<wire::ObjectChunk>,
) -> Result<wire::PushReply, Status> {
    let mut rpc = ObjectsClient::connect(format!("http://{address}"))
        .await
        .unwrap()
        .max_encoding_message_size(MAX_MESSAGE_BYTES);
    rpc.push(tokio_stream::iter(chunks))
        .await
        .map(Response::into_inner)
}

fn chunks_of(id: ObjectId, bytes: &Bytes, ticket: String) -> Vec<wire::ObjectChunk> {
    let meta = ObjectMeta {
        id,
        size: bytes.len() as u64,
        crc32c: crc32c::crc32c(bytes),
    };
    Chunks::new(meta, bytes.clone(), 0, MIB, ticket).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn objects_of_every_size_go_client_to_worker_to_worker_to_client_whole() {
    let a = node(1, 512 << 20, Fault::None).await;
    let b = node(2, 512 << 20, Fault::None).await;
    let sizes = [0, 1024, MIB, 100 * MIB];
    let mut ids = Vec::new();
    for (i, size) in sizes.into_iter().enumerate() {
        let id = ObjectId(7, i as u64);
        let bytes = data(size, i as u64);
        push_object(&a.address, &a.write(id), id, bytes.clone())
            .await
            .unwrap();
        // Worker to worker: B fetches it from A into its own store.
        let view = fetch_object(&b.objects, id, Some("ns".into()), &[a.holder(id)])
            .await
            .unwrap();
        assert_eq!(view.crc32c(), crc32c::crc32c(&bytes), "{size} bytes");
        assert_eq!(view.as_slice(), &bytes[..]);
        drop(view);
        // Worker to client, from B's copy.
        let fetched = client_fetch(&b.address, &b.read(id), id).await.unwrap();
        assert_eq!(fetched.len(), size);
        assert_eq!(crc32c::crc32c(&fetched), crc32c::crc32c(&bytes));
        ids.push(id);
    }
    a.holds(&ids);
    b.holds(&ids);
    // An object already here is answered without a holder.
    let view = fetch_object(&b.objects, ids[1], None, &[]).await.unwrap();
    assert_eq!(view.len(), 1024);
}

#[tokio::test]
async fn a_corrupted_chunk_is_refused_by_its_checksum_naming_the_object() {
    let a = node(1, 64 << 20, Fault::Corrupt(1)).await;
    let id = ObjectId(8, 0);
    let bytes = data(3 * MIB, 1);
    // A push with a flipped bit: refused, nothing kept.
    let mut chunks = chunks_of(id, &bytes, a.write(id));
    let mut flipped = chunks[2].data.to_vec();
    flipped[100] ^= 1;
    chunks[2].data = flipped.into();
    let e = raw_push(&a.address, chunks).await.unwrap_err();
    assert_eq!(e.code(), Code::DataLoss, "{e:?}");
    assert!(
        e.message().contains("object 8.0") && e.message().contains("corrupt"),
        "{e:?}"
    );
    a.holds(&[]);
    // Pushed whole, then served with chunk 1 flipped on the wire: the client refuses it.
    push_object(&a.address, &a.write(id), id, bytes.clone())
        .await
        .unwrap();
    let e = client_fetch(&a.address, &a.read(id), id).await.unwrap_err();
    let text = e.to_string();
    assert!(
        text.contains("object 8.0") && text.contains("corrupt"),
        "{text}"
    );
    assert!(matches!(e, ObjectTransferError::Stream { .. }), "{e:?}");
    // And the worker's fetcher, with no other holder, names the object and the node.
    let b = node(2, 64 << 20, Fault::None).await;
    let e = fetch_object(&b.objects, id, None, &[a.holder(id)])
        .await
        .unwrap_err();
    let text = e.to_string();
    assert!(
        text.contains("object 8.0") && text.contains("node 1") && text.contains("corrupt"),
        "{text}"
    );
    b.holds(&[]);
}

#[tokio::test]
async fn a_truncated_stream_is_refused_and_nothing_is_kept() {
    let a = node(1, 64 << 20, Fault::GoneAfter(2)).await;
    let id = ObjectId(9, 0);
    let bytes = data(4 * MIB, 2);
    let mut chunks = chunks_of(id, &bytes, a.write(id));
    chunks.truncate(3);
    let e = raw_push(&a.address, chunks).await.unwrap_err();
    assert_eq!(e.code(), Code::DataLoss, "{e:?}");
    assert!(
        e.message().contains("object 9.0") && e.message().contains("ended after"),
        "{e:?}"
    );
    a.holds(&[]);
    // A fetch whose holder stops sending part way.
    push_object(&a.address, &a.write(id), id, bytes)
        .await
        .unwrap();
    let e = client_fetch(&a.address, &a.read(id), id).await.unwrap_err();
    assert!(
        matches!(e, ObjectTransferError::BrokenOff { received, .. } if received == 2 * MIB as u64),
        "{e:?}"
    );
    assert!(e.to_string().contains("object 9.0"), "{e}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_holder_gone_mid_transfer_leaves_the_rest_to_the_next() {
    let gone = node(1, 64 << 20, Fault::GoneAfter(3)).await;
    let corrupt = node(2, 64 << 20, Fault::Corrupt(5)).await;
    let mut good = node(3, 64 << 20, Fault::None).await;
    let reader = node(4, 64 << 20, Fault::None).await;
    let id = ObjectId(10, 0);
    let bytes = data(8 * MIB + 5, 3);
    for holder in [&gone, &corrupt, &good] {
        push_object(&holder.address, &holder.write(id), id, bytes.clone())
            .await
            .unwrap();
    }
    let holders = [gone.holder(id), corrupt.holder(id), good.holder(id)];
    let view = fetch_object(&reader.objects, id, Some("ns".into()), &holders)
        .await
        .unwrap();
    assert_eq!(view.as_slice(), &bytes[..]);
    // Each holder was asked for the rest only: the first sent 3 MiB; the second the next
    // 5 MiB and the last 5 bytes, corrupted and not kept; the third those 5 bytes again.
    let sent = |n: &Node| n.sent.load(Ordering::Relaxed);
    assert_eq!(
        (sent(&gone), sent(&corrupt), sent(&good)),
        (3 * MIB as u64, 5 * MIB as u64 + 5, 5)
    );
    drop(view);
    reader.holds(&[id]);

    // Every holder gone: the error names the object and each node.
    let other = ObjectId(10, 1);
    let e = fetch_object(
        &reader.objects,
        other,
        None,
        &[gone.holder(other), good.holder(other)],
    )
    .await
    .unwrap_err();
    let text = e.to_string();
    for part in [
        "object 10.1",
        "node 1 at",
        "node 3 at",
        "not in this node's object store",
    ] {
        assert!(text.contains(part), "{part} not in {text}");
    }
    // A holder whose process is gone altogether.
    good.server.abort();
    let _ = (&mut good.server).await;
    let e = fetch_object(&reader.objects, other, None, &[good.holder(other)])
        .await
        .unwrap_err();
    assert!(e.to_string().contains("cannot connect"), "{e}");
    reader.holds(&[id]);
}

#[tokio::test]
async fn tickets_for_another_node_object_namespace_access_or_time_are_refused() {
    let a = node(1, 64 << 20, Fault::None).await;
    let b = node(2, 64 << 20, Fault::None).await;
    let id = ObjectId(11, 0);
    push_object(&a.address, &a.write(id), id, data(1000, 4))
        .await
        .unwrap();
    let ticket = |access,
                  objects: Vec<ObjectId>,
                  ns: Option<&str>,
                  expiry_ms,
                  node: NodeId,
                  key: &[u8; 32]| {
        ObjectTicket {
            node,
            access,
            objects,
            expiry_ms,
            namespace: ns.map(str::to_owned),
        }
        .sign(key)
    };
    let later = now_ms() + 60_000;
    let read = ObjectAccess::Read;
    let refused = [
        // Signed by B's key for B: not valid on A.
        (b.read(id), Code::Unauthenticated, "not valid on this node"),
        // A's key, naming B.
        (
            ticket(read, vec![id], Some("ns"), later, b.id, &a.key),
            Code::Unauthenticated,
            "for node 2",
        ),
        (
            ticket(read, vec![ObjectId(11, 1)], Some("ns"), later, a.id, &a.key),
            Code::Unauthenticated,
            "does not name object 11.0",
        ),
        (
            ticket(read, vec![id], Some("other"), later, a.id, &a.key),
            Code::PermissionDenied,
            "namespace",
        ),
        (
            ticket(read, vec![id], None, later, a.id, &a.key),
            Code::PermissionDenied,
            "namespace",
        ),
        (
            ticket(read, vec![id], Some("ns"), now_ms() - 1000, a.id, &a.key),
            Code::Unauthenticated,
            "expired",
        ),
        (
            ticket(
                ObjectAccess::Write,
                vec![id],
                Some("ns"),
                later,
                a.id,
                &a.key,
            ),
            Code::Unauthenticated,
            "grants write",
        ),
        ("garbage".to_string(), Code::Unauthenticated, "not valid"),
    ];
    for (text, code, words) in refused {
        let e = client_fetch(&a.address, &text, id).await.unwrap_err();
        assert_eq!(e.code(), Some(code), "{e}");
        assert!(e.to_string().contains(words), "{words} not in {e}");
        assert!(e.to_string().contains("object 11.0"), "{e}");
    }
    // A read ticket does not write.
    let other = ObjectId(11, 2);
    let e = push_object(&a.address, &a.read(other), other, data(10, 5))
        .await
        .unwrap_err();
    assert_eq!(e.code(), Some(Code::Unauthenticated), "{e}");
    a.holds(&[id]);
    // The right one still reads.
    assert_eq!(
        client_fetch(&a.address, &a.read(id), id)
            .await
            .unwrap()
            .len(),
        1000
    );
}

#[tokio::test]
async fn a_push_past_the_stores_capacity_is_refused_and_leaves_nothing() {
    let a = node(1, 4 * MIB as u64, Fault::None).await;
    let id = ObjectId(12, 0);
    let e = push_object(&a.address, &a.write(id), id, data(5 * MIB, 6))
        .await
        .unwrap_err();
    assert_eq!(e.code(), Some(Code::ResourceExhausted), "{e}");
    let text = e.to_string();
    assert!(
        text.contains("object 12.0") && text.contains("--object-store-memory"),
        "{text}"
    );
    assert!(e.is_retryable());
    a.holds(&[]);
    assert_eq!(a.objects.store().usage().memory_bytes, 0);
    // The same object twice: the second is refused, the first kept.
    let small = data(MIB, 7);
    push_object(&a.address, &a.write(id), id, small.clone())
        .await
        .unwrap();
    let e = push_object(&a.address, &a.write(id), id, small)
        .await
        .unwrap_err();
    assert_eq!(e.code(), Some(Code::AlreadyExists), "{e}");
    a.holds(&[id]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_data_planes_own_fetch_answer_is_read_whole_by_the_fetcher_and_by_tonic() {
    // The holder as the worker serves it: each chunk's bytes are written to the socket from
    // the mapped object, not through tonic's encoder. Read by the worker's fetcher (by hand)
    // and by the client (tonic's `Streaming`), checked by size and checksum.
    let a = node(1, 256 << 20, Fault::Plane).await;
    let b = node(2, 256 << 20, Fault::None).await;
    let mut ids = Vec::new();
    for (i, size) in [0, 1, 1024, MIB, 3 * MIB + 7, 40 * MIB]
        .into_iter()
        .enumerate()
    {
        let id = ObjectId(13, i as u64);
        let bytes = data(size, 20 + i as u64);
        push_object(&a.address, &a.write(id), id, bytes.clone())
            .await
            .unwrap();
        let view = fetch_object(&b.objects, id, Some("ns".into()), &[a.holder(id)])
            .await
            .unwrap();
        assert_eq!(view.as_slice(), &bytes[..], "{size} bytes");
        drop(view);
        let fetched = client_fetch(&a.address, &a.read(id), id).await.unwrap();
        assert_eq!(fetched, bytes, "{size} bytes");
        ids.push(id);
    }
    b.holds(&ids);
    // A holder gone part way, then the plane's holder asked for the rest from where it
    // stopped.
    let gone = node(3, 64 << 20, Fault::GoneAfter(2)).await;
    let id = ObjectId(13, 99);
    let bytes = data(5 * MIB + 3, 9);
    for holder in [&gone, &a] {
        push_object(&holder.address, &holder.write(id), id, bytes.clone())
            .await
            .unwrap();
    }
    let view = fetch_object(
        &b.objects,
        id,
        Some("ns".into()),
        &[gone.holder(id), a.holder(id)],
    )
    .await
    .unwrap();
    assert_eq!(view.as_slice(), &bytes[..]);
    assert_eq!(gone.sent.load(Ordering::Relaxed), 2 * MIB as u64);
    drop(view);
    // Refusals come back as the holder's status, naming the object, to both readers.
    let missing = ObjectId(13, 100);
    let e = client_fetch(&a.address, &a.read(missing), missing)
        .await
        .unwrap_err();
    assert_eq!(e.code(), Some(Code::NotFound), "{e}");
    let e = client_fetch(&a.address, &b.read(ids[1]), ids[1])
        .await
        .unwrap_err();
    assert_eq!(e.code(), Some(Code::Unauthenticated), "{e}");
    let e = fetch_object(&b.objects, missing, None, &[a.holder(missing)])
        .await
        .unwrap_err();
    let text = e.to_string();
    assert!(
        text.contains("object 13.100") && text.contains("NotFound") && text.contains("node 1"),
        "{text}"
    );
    let bad = Holder {
        ticket: "garbage".into(),
        ..a.holder(missing)
    };
    let e = fetch_object(&b.objects, missing, None, &[bad])
        .await
        .unwrap_err();
    assert!(e.to_string().contains("Unauthenticated"), "{e}");
    a.holds(&[&ids[..], &[id]].concat());
}

/// A memfd named `name` holding `bytes`, sealed as a client seals one when `sealed`.
fn memfd(name: &str, bytes: &[u8], sealed: bool) -> std::fs::File {
    use std::io::Write as _;
    let mut file = escher_client::objects::new_memfd(name).unwrap();
    file.write_all(bytes).unwrap();
    if sealed {
        escher_client::objects::seal(&file).unwrap();
    }
    file
}

/// What a client sends to hand `file` over as object `id` of `size` bytes.
fn handover_request(
    ticket: &str,
    id: ObjectId,
    file: &std::fs::File,
    size: u64,
) -> wire::HandoverRequest {
    use std::os::fd::AsRawFd as _;
    wire::HandoverRequest {
        ticket: ticket.to_string(),
        owner: id.owner(),
        index: id.index(),
        pid: std::process::id(),
        fd: file.as_raw_fd(),
        size,
        boot_id: handover::boot_id().to_string(),
        crc32c: 0,
        has_crc32c: false,
    }
}

/// A raw handover, as a misbehaving client would ask it.
async fn raw_handover(
    address: &str,
    request: wire::HandoverRequest,
) -> Result<wire::PushReply, Status> {
    let mut rpc = ObjectsClient::connect(format!("http://{address}"))
        .await
        .unwrap();
    rpc.handover(request).await.map(Response::into_inner)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sealed_memfd_of_every_size_is_handed_over_whole() {
    let a = node(1, 512 << 20, Fault::None).await;
    let mut ids = Vec::new();
    for (i, size) in [0, 1024, MIB, 100 * MIB].into_iter().enumerate() {
        let id = ObjectId(8, i as u64);
        let bytes = data(size, 40 + i as u64);
        let ticket = a.write(id);
        let name = escher_proto::transfer::handover_name(&ticket, id).unwrap();
        let file = memfd(&name, &bytes, true);
        let mut request = handover_request(&ticket, id, &file, size as u64);
        // Every other one with the client's own sum, which the worker checks.
        if i % 2 == 1 {
            request.crc32c = crc32c::crc32c(&bytes);
            request.has_crc32c = true;
        }
        let reply = raw_handover(&a.address, request).await.unwrap();
        assert_eq!(
            (reply.size, reply.crc32c),
            (size as u64, crc32c::crc32c(&bytes)),
            "{size} bytes"
        );
        drop(file);
        // The store's copy is the bytes, and readable after the client's file is gone.
        let view = a.objects.store().get(id).unwrap();
        assert_eq!(view.crc32c(), crc32c::crc32c(&bytes));
        assert_eq!(view.as_slice(), &bytes[..]);
        assert_eq!(a.objects.namespace(id), Some(Some("ns".to_string())));
        drop(view);
        ids.push(id);
    }
    a.holds(&ids);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn files_the_worker_cannot_trust_are_refused_naming_why_and_nothing_is_stored() {
    let a = node(1, 8 * MIB as u64, Fault::None).await;
    let id = ObjectId(9, 0);
    let ticket = a.write(id);
    let name = escher_proto::transfer::handover_name(&ticket, id).unwrap();
    let bytes = data(64 * 1024, 5);
    let size = bytes.len() as u64;
    let refused = |r: Result<wire::PushReply, Status>, code: Code, text: &str| {
        let status = r.expect_err("refused");
        assert_eq!(status.code(), code, "{status:?}");
        assert!(status.message().contains(text), "{status:?}");
        assert!(status.message().contains(&id.to_string()) || code != Code::FailedPrecondition);
        a.holds(&[]);
    };

    // Not sealed: its bytes could still change while, or after, they are read.
    let open = memfd(&name, &bytes, false);
    let r = raw_handover(&a.address, handover_request(&ticket, id, &open, size)).await;
    refused(r, Code::FailedPrecondition, "F_SEAL_WRITE");
    drop(open);

    // Sealed against size changes only.
    let partly = memfd(&name, &bytes, false);
    {
        use nix::fcntl::{FcntlArg, SealFlag, fcntl};
        fcntl(
            &partly,
            FcntlArg::F_ADD_SEALS(SealFlag::F_SEAL_GROW | SealFlag::F_SEAL_SHRINK),
        )
        .unwrap();
    }
    let r = raw_handover(&a.address, handover_request(&ticket, id, &partly, size)).await;
    refused(r, Code::FailedPrecondition, "not sealed with F_SEAL_WRITE");
    drop(partly);

    let sealed = memfd(&name, &bytes, true);
    // Of another size than the object's.
    let r = raw_handover(&a.address, handover_request(&ticket, id, &sealed, size + 1)).await;
    refused(r, Code::FailedPrecondition, &format!("holds {size} bytes"));

    // Named for another object, or with another nonce, or not a memfd at all.
    let other_id = ObjectId(9, 1);
    let other = memfd(
        &escher_proto::transfer::handover_name(&a.write(other_id), other_id).unwrap(),
        &bytes,
        true,
    );
    let r = raw_handover(&a.address, handover_request(&ticket, id, &other, size)).await;
    refused(r, Code::FailedPrecondition, "not the memfd");
    let forged = memfd(&format!("escher-put-9.0-{}", "0".repeat(16)), &bytes, true);
    let r = raw_handover(&a.address, handover_request(&ticket, id, &forged, size)).await;
    refused(r, Code::FailedPrecondition, "not the memfd");
    let plain = tempfile::tempfile_in("/dev/shm").unwrap();
    plain.set_len(size).unwrap();
    let r = raw_handover(&a.address, handover_request(&ticket, id, &plain, size)).await;
    refused(r, Code::FailedPrecondition, "not the memfd");

    // A pid or descriptor that is not the client's memfd: another process's descriptor, a
    // descriptor not open, a process that does not exist, another machine.
    let mut request = handover_request(&ticket, id, &sealed, size);
    request.pid = 1;
    refused(
        raw_handover(&a.address, request).await,
        Code::FailedPrecondition,
        "/proc/1/fd/",
    );
    let mut request = handover_request(&ticket, id, &sealed, size);
    request.fd = 100_000;
    refused(
        raw_handover(&a.address, request).await,
        Code::FailedPrecondition,
        "cannot open the client's descriptor",
    );
    let mut request = handover_request(&ticket, id, &sealed, size);
    request.pid = u32::MAX - 1;
    refused(
        raw_handover(&a.address, request).await,
        Code::FailedPrecondition,
        "cannot open the client's descriptor",
    );
    let mut request = handover_request(&ticket, id, &sealed, size);
    request.boot_id = "another-machine".into();
    refused(
        raw_handover(&a.address, request).await,
        Code::FailedPrecondition,
        "another machine",
    );

    // The right file with another checksum than the client says: refused by the seal.
    let mut request = handover_request(&ticket, id, &sealed, size);
    request.crc32c = crc32c::crc32c(&bytes) ^ 1;
    request.has_crc32c = true;
    refused(
        raw_handover(&a.address, request).await,
        Code::DataLoss,
        &id.to_string(),
    );

    // A read ticket, or one for another object, is no permission to write.
    let request = handover_request(&a.read(id), id, &sealed, size);
    refused(
        raw_handover(&a.address, request).await,
        Code::Unauthenticated,
        "",
    );

    // Larger than the store: refused as a push would be, before anything is copied.
    let big_id = ObjectId(9, 2);
    let big_ticket = a.write(big_id);
    let big = memfd(
        &escher_proto::transfer::handover_name(&big_ticket, big_id).unwrap(),
        &data(9 * MIB, 6),
        true,
    );
    let request = handover_request(&big_ticket, big_id, &big, 9 * MIB as u64);
    refused(
        raw_handover(&a.address, request).await,
        Code::ResourceExhausted,
        &big_id.to_string(),
    );

    // And the same file, asked for properly, is taken.
    let reply = raw_handover(&a.address, handover_request(&ticket, id, &sealed, size))
        .await
        .unwrap();
    assert_eq!(reply.crc32c, crc32c::crc32c(&bytes));
    a.holds(&[id]);
}
