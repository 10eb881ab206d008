//! Objects on the data plane of real `escher-worker` processes (the binary, against the fake
//! head, which issues each node's secret, so the test signs object tickets as the head does):
//! pushes and fetches of 0 B to 100 MiB with checksums compared, tickets of another node or
//! past their expiry refused, and a worker SIGKILLed in the middle of a fetch, whose reader
//! gets the object from the next holder.

mod support;

use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use bytes::Bytes;
use escher_client::objects::{ObjectTransferError, fetch_object as client_fetch, push_object};
use escher_proto::NodeId;
use escher_proto::transfer::{ChunkReader, MAX_MESSAGE_BYTES};
use escher_proto::types::{DATA_ADDRESS_LABEL, ObjectAccess, ObjectTicket, ticket_key};
use escher_proto::wire::{self, objects_client::ObjectsClient};
use escher_worker::objects::{
    Holder, NodeObjects, ObjectId, ObjectStore, StoreConfig, fetch_object,
};
use sha2::Digest as _;
use support::{FakeHead, attached, bounded};
use tonic::Code;

const MIB: usize = 1 << 20;

/// A worker process, SIGKILLed and reaped when the test ends however it ends.
struct WorkerProcess {
    child: Child,
    node: NodeId,
    address: String,
    key: [u8; 32],
}

impl Drop for WorkerProcess {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl WorkerProcess {
    /// Starts `escher-worker` named `name` with an object store of `capacity` bytes under
    /// `dir`, and waits until it has attached to `head`.
    async fn start(head: &mut FakeHead, dir: &Path, name: &str, capacity: u64) -> WorkerProcess {
        let shm = dir.join(format!("{name}-objects"));
        std::fs::create_dir_all(&shm).unwrap();
        let child = Command::new(env!("CARGO_BIN_EXE_escher-worker"))
            .args([
                "--head",
                &head.url(),
                "--name",
                name,
                "--no-pid-namespace",
                "--no-python",
            ])
            .arg("--state-dir")
            .arg(dir.join(format!("{name}-state")))
            .arg("--log-dir")
            .arg(dir.join(format!("{name}-logs")))
            .arg("--object-store-memory")
            .arg(capacity.to_string())
            .arg("--object-store-dir")
            .arg(&shm)
            .env("ESCHER_TOKEN", "fake")
            .stdout(Stdio::null())
            .spawn()
            .unwrap();
        let mut worker = WorkerProcess {
            child,
            node: NodeId(0),
            address: String::new(),
            key: [0; 32],
        };
        let (registration, node) = attached(head).await;
        worker.node = node;
        worker.address = registration
            .labels
            .get(DATA_ADDRESS_LABEL)
            .expect("the worker publishes its data-plane address")
            .to_string();
        // The fake head issues `secret-N` to node N; the head keeps its hash.
        let secret = format!("secret-{}", node.0);
        worker.key = ticket_key(&sha2::Sha256::digest(secret.as_bytes()).into());
        worker
    }

    fn ticket(&self, access: ObjectAccess, id: ObjectId, expiry_ms: u64) -> String {
        ObjectTicket {
            node: self.node,
            access,
            objects: vec![id],
            expiry_ms,
            namespace: Some("team".into()),
        }
        .sign(&self.key)
    }

    fn read(&self, id: ObjectId) -> String {
        self.ticket(ObjectAccess::Read, id, now_ms() + 60_000)
    }

    fn write(&self, id: ObjectId) -> String {
        self.ticket(ObjectAccess::Write, id, now_ms() + 60_000)
    }

    /// Pushes `bytes` as `id`, waiting out the moment between the worker's `Hello` and its
    /// ticket key being in place.
    async fn push(&self, id: ObjectId, bytes: Bytes) {
        bounded("a push", async {
            loop {
                match push_object(&self.address, &self.write(id), id, bytes.clone()).await {
                    Ok(()) => return,
                    Err(e) if e.code() == Some(Code::Unavailable) => {
                        tokio::time::sleep(Duration::from_millis(20)).await;
                    }
                    Err(e) => panic!("push of {id}: {e}"),
                }
            }
        })
        .await;
    }

    fn kill(&mut self) {
        self.child.kill().unwrap();
        self.child.wait().unwrap();
    }
}

fn now_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis() as u64
}

fn data(size: usize, seed: u64) -> Bytes {
    let mut bytes = vec![0; size];
    fastrand::Rng::with_seed(seed).fill(&mut bytes);
    bytes.into()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn objects_of_every_size_go_in_and_out_of_a_worker_process_whole() {
    let mut head = FakeHead::start(Duration::from_millis(200)).await;
    let dir = tempfile::tempdir().unwrap();
    let worker = WorkerProcess::start(&mut head, dir.path(), "holder", 160 << 20).await;
    for (i, size) in [0, 1024, MIB, 100 * MIB].into_iter().enumerate() {
        let id = ObjectId(5, i as u64);
        let bytes = data(size, i as u64);
        worker.push(id, bytes.clone()).await;
        let back = client_fetch(&worker.address, &worker.read(id), id)
            .await
            .unwrap();
        assert_eq!(back.len(), size);
        assert_eq!(
            crc32c::crc32c(&back),
            crc32c::crc32c(&bytes),
            "{size} bytes"
        );
    }
    let id = ObjectId(5, 1);
    // Another node's ticket (signed with its key, or naming it), and an expired one.
    let other = ObjectTicket {
        node: NodeId(worker.node.0 + 1),
        access: ObjectAccess::Read,
        objects: vec![id],
        expiry_ms: now_ms() + 60_000,
        namespace: Some("team".into()),
    };
    let other_key = ticket_key(&sha2::Sha256::digest(b"secret-99").into());
    for (ticket, words) in [
        (other.sign(&worker.key), "not this node"),
        (other.sign(&other_key), "not valid on this node"),
        (
            worker.ticket(ObjectAccess::Read, id, now_ms() - 1),
            "expired",
        ),
    ] {
        let e = client_fetch(&worker.address, &ticket, id)
            .await
            .unwrap_err();
        assert_eq!(e.code(), Some(Code::Unauthenticated), "{e}");
        assert!(e.to_string().contains(words), "{words} not in {e}");
    }
    // Larger than the store's capacity (what is there would spill to make room for less):
    // refused, naming the object.
    let big = ObjectId(5, 9);
    let e = push_object(&worker.address, &worker.write(big), big, data(170 * MIB, 9))
        .await
        .unwrap_err();
    assert_eq!(e.code(), Some(Code::ResourceExhausted), "{e}");
    assert!(e.to_string().contains("object 5.9"), "{e}");
    let e = client_fetch(&worker.address, &worker.read(big), big)
        .await
        .unwrap_err();
    assert_eq!(e.code(), Some(Code::NotFound), "nothing was kept: {e}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_worker_killed_mid_fetch_leaves_the_object_to_the_next_holder() {
    let mut head = FakeHead::start(Duration::from_millis(200)).await;
    let dir = tempfile::tempdir().unwrap();
    let mut first = WorkerProcess::start(&mut head, dir.path(), "first", 256 << 20).await;
    let second = WorkerProcess::start(&mut head, dir.path(), "second", 256 << 20).await;
    let id = ObjectId(6, 0);
    let bytes = data(100 * MIB, 6);
    first.push(id, bytes.clone()).await;
    second.push(id, bytes.clone()).await;

    // A fetch from the first, which is killed once the first chunk has come.
    let mut rpc = ObjectsClient::connect(format!("http://{}", first.address))
        .await
        .unwrap()
        .max_decoding_message_size(MAX_MESSAGE_BYTES);
    let request = wire::FetchRequest {
        ticket: first.read(id),
        owner: id.owner(),
        index: id.index(),
        offset: 0,
    };
    let mut stream = rpc.fetch(request).await.unwrap().into_inner();
    let mut reader = ChunkReader::new(Some(id), 0);
    reader
        .accept(stream.message().await.unwrap().unwrap())
        .unwrap();
    first.kill();
    let ended = bounded("the stream to break", async {
        loop {
            match stream.message().await {
                Ok(Some(chunk)) => {
                    reader.accept(chunk).unwrap();
                }
                Ok(None) => return Ok(()),
                Err(status) => return Err(status),
            }
        }
    })
    .await;
    assert!(ended.is_err(), "a killed holder's stream ends in an error");
    assert!(reader.received() < bytes.len() as u64);
    assert!(reader.finish().is_err(), "what came is not the object");

    // The worker's fetcher: the dead holder first, then the live one.
    let shm = tempfile::tempdir_in(dir.path()).unwrap();
    let objects = NodeObjects::new(
        ObjectStore::open(StoreConfig {
            capacity: 256 << 20,
            memory_root: shm.path().to_path_buf(),
            spill_root: dir.path().to_path_buf(),
        })
        .unwrap(),
    );
    let holder = |w: &WorkerProcess| Holder {
        node: w.node,
        address: w.address.clone(),
        ticket: w.read(id),
    };
    let e = fetch_object(&objects, id, None, &[holder(&first)])
        .await
        .unwrap_err();
    let text = e.to_string();
    assert!(
        text.contains("object 6.0") && text.contains(&format!("node {}", first.node)),
        "{text}"
    );
    let view = fetch_object(
        &objects,
        id,
        Some("team".into()),
        &[holder(&first), holder(&second)],
    )
    .await
    .unwrap();
    assert_eq!(view.crc32c(), crc32c::crc32c(&bytes));
    assert_eq!(view.as_slice(), &bytes[..]);
    // And the client, from the dead one: unreachable, retryable.
    let e = client_fetch(&first.address, &first.read(id), id)
        .await
        .unwrap_err();
    assert!(
        matches!(e, ObjectTransferError::Unreachable { .. }),
        "{e:?}"
    );
    assert!(e.is_retryable());
}
