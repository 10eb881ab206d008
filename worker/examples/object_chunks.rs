//! Measures object fetches over the data plane, beside one loopback TCP stream (the numbers
//! are in docs/ARCHITECTURE.md "Objects"). Run in release:
//!
//! ```text
//! cargo run --release -p escher-worker --example object_chunks -- [MIB] [ROUNDS] [KIB,KIB..]
//! ```
//!
//! (with the worker binary's jemalloc; `--no-default-features` for the system allocator).
//!
//! First the store's write alone: an object of MIB MiB (default 256) written into a store on
//! `/dev/shm` in 1 MiB pieces, as a fetch writes it, with its room allocated up front
//! (`create`, `fallocate`) and checked only (`create_streamed`, what a fetch uses). Then for
//! each chunk size (KiB, default 1024), a holder's `Objects` service on `127.0.0.1:0`, served
//! as the worker's data plane serves it (`ObjectService::into_server`, `Fetch` written by
//! hand) and by tonic's generated server alone (its encoder copies every chunk), serves the
//! object; it is fetched ROUNDS times (default 5) worker to worker (the fetcher into a second
//! store) and worker to client (`escher_client::objects::fetch_object`, into one buffer), and
//! the stream alone (each chunk checked, then dropped) read by hand as the fetcher reads it
//! (`escher_proto::object_stream`) and by tonic's client (its decoder copies every frame).
//! Printed: for each, the median throughput and the median CPU time of the process (both
//! ends) per transfer, which other load on the machine does not change; and the throughput
//! of one TCP stream on loopback moving the same bytes.

use std::time::{Duration, Instant};

use bytes::Bytes;
use escher_proto::NodeId;
use escher_proto::data_channel;
use escher_proto::transfer::{CONNECTION_WINDOW_BYTES, MAX_MESSAGE_BYTES, STREAM_WINDOW_BYTES};
use escher_proto::types::{ObjectAccess, ObjectTicket, ticket_key};
use escher_proto::wire::objects_client::ObjectsClient;
use escher_proto::wire::objects_server::ObjectsServer;
use escher_worker::objects::{
    Holder, NodeObjects, ObjectId, ObjectService, ObjectStore, StoreConfig, fetch_object,
};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tonic::codegen::{Body, StdError};

const MIB: usize = 1 << 20;

/// The worker binary's allocator, when built with it (the `bin` feature), so that the buffers
/// a transfer allocates cost what they cost in a worker.
#[cfg(feature = "bin")]
#[global_allocator]
static ALLOCATOR: tikv_jemallocator::Jemalloc = tikv_jemallocator::Jemalloc;

fn store(capacity: u64) -> NodeObjects {
    NodeObjects::new(
        ObjectStore::open(StoreConfig {
            capacity,
            ..StoreConfig::default()
        })
        .expect("a store on /dev/shm"),
    )
}

/// Serves `objects` as node 1 with chunks of `chunk` bytes, as the worker's data plane does
/// (`ObjectService::into_server`: `Fetch` written by hand) or, when `tonic_fetch`, with tonic's
/// generated server only (its encoder copies each chunk); returns the address.
async fn serve(objects: NodeObjects, key: [u8; 32], chunk: usize, tonic_fetch: bool) -> String {
    let service = ObjectService::with_key(objects, NodeId(1), key).with_chunk_bytes(chunk);
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let address = listener.local_addr().unwrap().to_string();
    let mut builder = tonic::transport::Server::builder()
        .tcp_nodelay(true)
        .initial_stream_window_size(STREAM_WINDOW_BYTES)
        .initial_connection_window_size(CONNECTION_WINDOW_BYTES)
        .max_frame_size(escher_proto::data_channel::MAX_FRAME_BYTES);
    let incoming = tokio_stream::wrappers::TcpListenerStream::new(listener);
    if tonic_fetch {
        tokio::spawn(
            builder
                .add_service(
                    ObjectsServer::new(service)
                        .max_decoding_message_size(MAX_MESSAGE_BYTES)
                        .max_encoding_message_size(MAX_MESSAGE_BYTES),
                )
                .serve_with_incoming(incoming),
        );
    } else {
        tokio::spawn(
            builder
                .add_service(service.into_server())
                .serve_with_incoming(incoming),
        );
    }
    address
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

fn gbps(bytes: usize, took: Duration) -> f64 {
    bytes as f64 / took.as_secs_f64() / 1e9
}

/// One TCP stream on loopback moving `bytes` in writes of 1 MiB: the ceiling to compare to.
async fn tcp_stream(bytes: usize) -> f64 {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let address = listener.local_addr().unwrap();
    let reader = tokio::spawn(async move {
        let (mut socket, _) = listener.accept().await.unwrap();
        let mut buf = vec![0u8; MIB];
        let mut got = 0;
        while got < bytes {
            let n = socket.read(&mut buf).await.unwrap();
            assert!(n > 0);
            got += n;
        }
    });
    let mut socket = tokio::net::TcpStream::connect(address).await.unwrap();
    socket.set_nodelay(true).unwrap();
    let chunk = vec![7u8; MIB];
    let start = Instant::now();
    let mut sent = 0;
    while sent < bytes {
        socket.write_all(&chunk).await.unwrap();
        sent += MIB;
    }
    reader.await.unwrap();
    gbps(bytes, start.elapsed())
}

#[tokio::main]
async fn main() {
    let mut args = std::env::args().skip(1);
    let mib: usize = args.next().map_or(256, |a| a.parse().expect("MIB"));
    let rounds: usize = args.next().map_or(5, |a| a.parse().expect("ROUNDS"));
    let size = mib * MIB;
    let key = ticket_key(&[1; 32]);
    let id = ObjectId(1, 0);
    let mut data = vec![0u8; size];
    fastrand::Rng::with_seed(1).fill(&mut data);
    let data = Bytes::from(data);
    let holder = store(2 * size as u64);
    let mut writer = holder.store().create(id, size as u64).unwrap();
    writer.append(&data).unwrap();
    writer.seal(crc32c::crc32c(&data)).unwrap();
    let ticket = ObjectTicket {
        node: NodeId(1),
        access: ObjectAccess::Read,
        objects: vec![id],
        expiry_ms: u64::MAX,
        namespace: None,
    }
    .sign(&key);
    let tcp = median(futures_tcp(size, rounds).await);
    println!("object {mib} MiB, {rounds} rounds, median GB/s; one loopback TCP stream: {tcp:.2}");
    println!(
        "each way: median GB/s, median CPU ms per transfer (both ends); served by the data \
         plane (Fetch written by hand) or by tonic's server alone; ways: worker->worker \
         (fetch_object into a store) | worker->client (into a buffer, tonic's client) | the \
         stream alone, checked and dropped, read by hand (as the fetcher) | the same read by \
         tonic's client"
    );
    let reader = store(2 * size as u64);
    // The store's write alone: the copy written into a store as a fetch writes it (1 MiB
    // pieces, each with its checksum), with its room allocated up front (`create`, the
    // `fallocate`) and checked only (`create_streamed`).
    let pieces: Vec<(u64, Bytes, u32)> = (0..size)
        .step_by(MIB)
        .map(|at| {
            let piece = data.slice(at..(at + MIB).min(size));
            let crc = crc32c::crc32c(&piece);
            (at as u64, piece, crc)
        })
        .collect();
    let mut writes: [(Vec<f64>, Vec<f64>); 2] = Default::default();
    for _ in 0..rounds {
        for (way, streamed) in [(0, false), (1, true)] {
            let other = ObjectId(2, 0);
            let (cpu, start) = (cpu_seconds(), Instant::now());
            let mut writer = if streamed {
                reader.store().create_streamed(other, size as u64).unwrap()
            } else {
                reader.store().create(other, size as u64).unwrap()
            };
            for (at, piece, crc) in &pieces {
                writer.write_summed(*at, piece, *crc).unwrap();
            }
            writer.seal(crc32c::crc32c(&data)).unwrap();
            record(&mut writes[way], size, start, cpu);
            reader.delete(other).unwrap();
        }
    }
    println!(
        "the store's write alone: with fallocate {:.2} GB/s {:.0} ms; room checked only \
         {:.2} GB/s {:.0} ms",
        median(writes[0].0.clone()),
        1e3 * median(writes[0].1.clone()),
        median(writes[1].0.clone()),
        1e3 * median(writes[1].1.clone()),
    );
    let chunks: Vec<usize> = match args.next() {
        Some(list) => list
            .split(',')
            .map(|k| k.parse::<usize>().expect("KIB") << 10)
            .collect(),
        None => vec![MIB],
    };
    for chunk in chunks {
        for tonic_fetch in [false, true] {
            let address = serve(holder.clone(), key, chunk, tonic_fetch).await;
            let holders = [Holder {
                node: NodeId(1),
                address: address.clone(),
                ticket: ticket.clone(),
            }];
            // Each way: the median throughput, and the process's CPU time (both ends, user
            // and system) per transfer, which the machine's other load does not change.
            let mut ways: [(Vec<f64>, Vec<f64>); 4] = Default::default();
            for _ in 0..rounds {
                let (cpu, start) = (cpu_seconds(), Instant::now());
                let view = fetch_object(&reader, id, None, &holders).await.unwrap();
                record(&mut ways[0], size, start, cpu);
                assert_eq!(view.len() as usize, size);
                drop(view);
                reader.delete(id).unwrap();
                let (cpu, start) = (cpu_seconds(), Instant::now());
                let bytes = escher_client::objects::fetch_object(&address, &ticket, id)
                    .await
                    .unwrap();
                record(&mut ways[1], size, start, cpu);
                assert_eq!(bytes.len(), size);
                drop(bytes);
                let (cpu, start) = (cpu_seconds(), Instant::now());
                let mut channel = data_channel::connect(&address, Duration::from_secs(3))
                    .await
                    .unwrap();
                assert_eq!(drain_by_hand(&mut channel, &ticket, id).await, size as u64);
                record(&mut ways[2], size, start, cpu);
                let (cpu, start) = (cpu_seconds(), Instant::now());
                let channel = data_channel::connect(&address, Duration::from_secs(3))
                    .await
                    .unwrap();
                let origin = channel.origin();
                let rpc = ObjectsClient::with_origin(channel, origin);
                assert_eq!(drain(rpc, &ticket, id).await, size as u64);
                record(&mut ways[3], size, start, cpu);
            }
            let server = if tonic_fetch { "tonic" } else { "plane" };
            print!("{:>5} KiB {server}", chunk >> 10);
            for (gbs, cpu) in ways {
                print!("  {:>5.2} GB/s {:>5.0} ms", median(gbs), 1e3 * median(cpu));
            }
            println!();
        }
    }
}

/// Records one transfer of `size` bytes that began at `start` with `cpu` seconds used.
fn record(way: &mut (Vec<f64>, Vec<f64>), size: usize, start: Instant, cpu: f64) {
    way.0.push(gbps(size, start.elapsed()));
    way.1.push(cpu_seconds() - cpu);
}

/// The CPU time this process used so far, user and system, in seconds (`/proc/self/stat`,
/// in clock ticks of 10 ms).
fn cpu_seconds() -> f64 {
    let stat = std::fs::read_to_string("/proc/self/stat").expect("/proc/self/stat");
    // The fields after the command's closing parenthesis; utime and stime are the 14th and
    // 15th of the line, the 12th and 13th of these.
    let rest = &stat[stat.rfind(')').expect("a stat line") + 2..];
    let ticks: Vec<f64> = rest
        .split_whitespace()
        .skip(11)
        .take(2)
        .map(|t| t.parse().expect("a tick count"))
        .collect();
    (ticks[0] + ticks[1]) / 100.0
}

/// Fetches the object over `rpc` and checks each chunk, then drops it: the stream alone, so
/// that the data channel's large frames and a tonic `Endpoint` channel's 16 KiB frames compare
/// with nothing else different. Returns the bytes received.
async fn drain<T>(rpc: ObjectsClient<T>, ticket: &str, id: ObjectId) -> u64
where
    T: tonic::client::GrpcService<tonic::body::Body>,
    T::Error: Into<StdError>,
    T::ResponseBody: Body<Data = Bytes> + Send + 'static,
    <T::ResponseBody as Body>::Error: Into<StdError> + Send,
{
    let mut rpc = rpc.max_decoding_message_size(MAX_MESSAGE_BYTES);
    let mut stream = rpc
        .fetch(escher_proto::wire::FetchRequest {
            ticket: ticket.to_string(),
            owner: id.owner(),
            index: id.index(),
            offset: 0,
        })
        .await
        .unwrap()
        .into_inner();
    let mut reader = escher_proto::transfer::ChunkReader::new(Some(id), 0);
    while let Some(chunk) = stream.message().await.unwrap() {
        reader.accept(chunk).unwrap();
    }
    reader.finish().unwrap().size
}

/// The stream alone read by hand (`escher_proto::object_stream`, as the fetcher reads it),
/// each chunk checked, then dropped. Returns the bytes received.
async fn drain_by_hand(channel: &mut data_channel::DataChannel, ticket: &str, id: ObjectId) -> u64 {
    let request = escher_proto::wire::FetchRequest {
        ticket: ticket.to_string(),
        owner: id.owner(),
        index: id.index(),
        offset: 0,
    };
    let mut stream = escher_proto::object_stream::fetch(channel, &request, MAX_MESSAGE_BYTES)
        .await
        .unwrap();
    let mut reader = escher_proto::transfer::ChunkReader::new(Some(id), 0);
    while let Some(chunk) = stream.message().await.unwrap() {
        reader.accept(chunk).unwrap();
    }
    reader.finish().unwrap().size
}

async fn futures_tcp(size: usize, rounds: usize) -> Vec<f64> {
    let mut v = Vec::new();
    for _ in 0..rounds {
        v.push(tcp_stream(size).await);
    }
    v
}
