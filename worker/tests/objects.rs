//! Objects on the data plane of real `escher-worker` processes (the binary, against the fake
//! head, which issues each node's secret, so the test signs object tickets as the head does):
//! pushes and fetches of 0 B to 100 MiB with checksums compared, tickets of another node or
//! past their expiry refused, and a worker SIGKILLed in the middle of a fetch, whose reader
//! gets the object from the next holder. And a task's object arguments, fetched by a worker in
//! this process from the holders its `Assign` names with no `LocateObject` call, or, when every
//! one of those fails (gone, no address, a forged or expired ticket), from where the head says
//! they are.

mod support;

use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use escher_client::objects::{ObjectTransferError, fetch_object as client_fetch, push_object};
use escher_proto::codec;
use escher_proto::transfer::{ChunkReader, MAX_MESSAGE_BYTES};
use escher_proto::types::{
    Assignment, DATA_ADDRESS_LABEL, HeadMessage, NAMESPACE_LABEL, Namespace, OBJECTS_LABEL,
    ObjectAccess, ObjectHolder, ObjectOwner, ObjectTicket, ObjectView as Located, TaskFinished,
    WorkerMessage, format_object_args, ticket_key,
};
use escher_proto::wire::{self, objects_client::ObjectsClient};
use escher_proto::{NodeId, ResourceSet, TaskId, TaskKind, TaskResult};
use escher_worker::objects::{
    Holder, NodeObjects, ObjectId, ObjectStore, StoreConfig, fetch_object,
};
use sha2::Digest as _;
use support::{FakeHead, RunningWorker, attached, bounded};
use tokio::sync::Notify;
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
        (worker.node, worker.address, worker.key) = joined(head).await;
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

/// Waits for a worker to attach to `head`: its node, data-plane address and ticket key.
async fn joined(head: &mut FakeHead) -> (NodeId, String, [u8; 32]) {
    let (registration, node) = attached(head).await;
    let address = registration
        .labels
        .get(DATA_ADDRESS_LABEL)
        .expect("the worker publishes its data-plane address")
        .to_string();
    // The fake head issues `secret-N` to node N; the head keeps its hash.
    let secret = format!("secret-{}", node.0);
    (node, address, node_key(&secret))
}

/// The ticket key of the node whose secret is `secret`.
fn node_key(secret: &str) -> [u8; 32] {
    ticket_key(&sha2::Sha256::digest(secret.as_bytes()).into())
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
    let other_key = node_key("secret-99");
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

/// A worker in this process, with a store of its own under `dir`, that runs `read_args`: each
/// object argument as (id, length, CRC-32C of the bytes it reads mapped from its store).
struct Runner {
    worker: RunningWorker,
    node: NodeId,
    address: String,
    key: [u8; 32],
    /// Notified each time `read_args_and_say` has read its arguments.
    read: Arc<Notify>,
}

impl Runner {
    async fn start(head: &mut FakeHead, dir: &Path) -> Runner {
        let store = dir.join("runner-objects");
        std::fs::create_dir_all(&store).unwrap();
        let read = Arc::new(Notify::new());
        let said = Arc::clone(&read);
        let builder = support::worker(head)
            .object_store_dir(&store)
            .object_store_memory(64 << 20)
            .object_spill_dir(dir)
            .typed_function("read_args", |ctx, ()| async move {
                let seen: Vec<(String, u64, u32)> = ctx
                    .object_args()
                    .iter()
                    .map(|o| {
                        let bytes = o.as_slice();
                        (
                            o.id().to_string(),
                            bytes.len() as u64,
                            crc32c::crc32c(bytes),
                        )
                    })
                    .collect();
                Ok::<_, String>(seen)
            })
            .typed_function("read_args_and_say", move |ctx, ()| {
                let said = Arc::clone(&said);
                async move {
                    let sums: Vec<u32> = ctx
                        .object_args()
                        .iter()
                        .map(|o| crc32c::crc32c(o.as_slice()))
                        .collect();
                    said.notify_one();
                    Ok::<_, String>(sums)
                }
            });
        let worker = RunningWorker::start(builder);
        let (node, address, key) = joined(head).await;
        Runner {
            worker,
            node,
            address,
            key,
            read,
        }
    }

    /// Runs `read_args` as task `task` on object arguments `ids`, with `located` in its
    /// `Assign`, and returns its report.
    async fn run(
        &self,
        head: &mut FakeHead,
        task: u64,
        ids: &[ObjectId],
        located: Vec<Located>,
    ) -> TaskFinished {
        self.run_function(head, "read_args", task, ids, located)
            .await
    }

    /// [`Runner::run`] of function `name`.
    async fn run_function(
        &self,
        head: &mut FakeHead,
        name: &str,
        task: u64,
        ids: &[ObjectId],
        located: Vec<Located>,
    ) -> TaskFinished {
        let mut spec = support::spec(TaskKind::Function {
            name: name.into(),
            args: codec::encode(&()).unwrap().into(),
        });
        spec.labels
            .insert(OBJECTS_LABEL, &format_object_args(ids))
            .unwrap();
        spec.labels.insert(NAMESPACE_LABEL, "team").unwrap();
        head.send(HeadMessage::Assign(Assignment {
            task_id: TaskId(task),
            attempt: 1,
            spec,
            allocation: ResourceSet::new(),
            task_token: format!("escher-task-{task}"),
            objects: located,
        }));
        loop {
            if let WorkerMessage::TaskFinished(done) = head.report().await
                && done.task_id == TaskId(task)
            {
                return done;
            }
        }
    }
}

/// What the head would say of `id` with `bytes`, copies at `holders`.
fn located(id: ObjectId, bytes: &[u8], holders: Vec<ObjectHolder>) -> Located {
    Located {
        id,
        namespace: Some(Namespace::new("team").unwrap()),
        size: bytes.len() as u64,
        checksum: crc32c::crc32c(bytes),
        owner: ObjectOwner::Session(id.owner()),
        sealed_at_ms: now_ms(),
        holders,
        lost: None,
    }
}

/// `worker`'s copy of `id`, with a read ticket `ticket`.
fn copy_at(worker: &WorkerProcess, ticket: String) -> ObjectHolder {
    ObjectHolder {
        node: worker.node,
        address: Some(worker.address.clone()),
        ticket: Some(ticket),
    }
}

/// What `read_args` returned.
fn returned(done: &TaskFinished) -> Vec<(String, u64, u32)> {
    match &done.outcome {
        Ok(TaskResult::Returned(bytes)) => codec::decode(bytes).unwrap(),
        other => panic!("task {} did not return: {other:?}", done.task_id),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_task_fetches_from_the_holders_its_assign_names_and_asks_the_head_only_when_they_fail() {
    // The holder is another head's node (numbered apart), so that this head's one stream is
    // the runner's and every report on it the runner's.
    let mut holders_head = FakeHead::start(Duration::from_millis(200)).await;
    holders_head.number_nodes_from(50);
    let mut head = FakeHead::start(Duration::from_millis(200)).await;
    let dir = tempfile::tempdir().unwrap();
    let holder = WorkerProcess::start(&mut holders_head, dir.path(), "holder", 64 << 20).await;
    let ids = [ObjectId(7, 0), ObjectId(7, 1), ObjectId(7, 2)];
    let values: Vec<Bytes> = (0..3).map(|i| data(MIB + i, 70 + i as u64)).collect();
    for (id, value) in ids.iter().zip(&values) {
        holder.push(*id, value.clone()).await;
    }
    let runner = Runner::start(&mut head, dir.path()).await;
    let want = |i: usize| {
        (
            ids[i].to_string(),
            values[i].len() as u64,
            crc32c::crc32c(&values[i]),
        )
    };

    // The Assign names the holder with a ticket: fetched from it, the head never asked (it
    // would not know the object), and the new copy reported.
    let given = located(
        ids[0],
        &values[0],
        vec![copy_at(&holder, holder.read(ids[0]))],
    );
    let done = runner.run(&mut head, 1, &ids[..1], vec![given]).await;
    assert_eq!(returned(&done), vec![want(0)]);
    assert_eq!(
        head.locate_calls(),
        Vec::<ObjectId>::new(),
        "no LocateObject"
    );
    assert_eq!(head.sealed(), vec![(ids[0], runner.node)]);

    // Every holder the Assign names fails: a closed port, an address that is none, the holder
    // with a ticket signed by another key, and with an expired one. The worker asks the head
    // and fetches from the holder it names.
    let failing = |id: ObjectId| {
        let forged = ObjectTicket {
            node: holder.node,
            access: ObjectAccess::Read,
            objects: vec![id],
            expiry_ms: now_ms() + 60_000,
            namespace: Some("team".into()),
        }
        .sign(&node_key("secret-99"));
        vec![
            ObjectHolder {
                node: NodeId(98),
                address: Some("127.0.0.1:1".into()),
                ticket: Some(holder.read(id)),
            },
            ObjectHolder {
                node: NodeId(99),
                address: Some("not an address".into()),
                ticket: Some(holder.read(id)),
            },
            copy_at(&holder, forged),
            copy_at(&holder, holder.ticket(ObjectAccess::Read, id, now_ms() - 1)),
        ]
    };
    head.locates(located(
        ids[1],
        &values[1],
        vec![copy_at(&holder, holder.read(ids[1]))],
    ));
    let given = located(ids[1], &values[1], failing(ids[1]));
    let done = runner.run(&mut head, 2, &ids[1..2], vec![given]).await;
    assert_eq!(returned(&done), vec![want(1)]);
    assert_eq!(head.locate_calls(), vec![ids[1]]);

    // The same, and the head does not know the object: the task fails naming it, and nothing
    // of it was kept in the runner's store.
    let given = located(ids[2], &values[2], failing(ids[2]));
    let done = runner.run(&mut head, 3, &ids[2..], vec![given]).await;
    let Err(why) = &done.outcome else {
        panic!("expected a failure, got {done:?}");
    };
    assert!(
        why.contains("object argument 7.2") && why.contains("unknown"),
        "{why}"
    );
    assert_eq!(head.locate_calls(), vec![ids[1], ids[2]]);
    let ticket = ObjectTicket {
        node: runner.node,
        access: ObjectAccess::Read,
        objects: vec![ids[2]],
        expiry_ms: now_ms() + 60_000,
        namespace: Some("team".into()),
    }
    .sign(&runner.key);
    let e = client_fetch(&runner.address, &ticket, ids[2])
        .await
        .unwrap_err();
    assert_eq!(e.code(), Some(Code::NotFound), "{e}");
    // The copies the runner holds are the two it fetched whole.
    assert_eq!(
        head.sealed(),
        vec![(ids[0], runner.node), (ids[1], runner.node)]
    );
    runner.worker.stop().await.unwrap();
}

/// A copy the head does not record (its object was freed between the worker's look-up and its
/// report) counts nowhere, so it must not stay in the store: the task that fetched it still
/// reads it whole, and the store lets it go once the task has.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fetched_copy_the_head_leaves_out_is_deleted_once_its_task_is_done() {
    let mut holders_head = FakeHead::start(Duration::from_millis(200)).await;
    holders_head.number_nodes_from(50);
    let mut head = FakeHead::start(Duration::from_millis(200)).await;
    let dir = tempfile::tempdir().unwrap();
    let holder = WorkerProcess::start(&mut holders_head, dir.path(), "holder", 64 << 20).await;
    let (kept, freed) = (ObjectId(8, 0), ObjectId(8, 1));
    let values = [data(MIB, 80), data(MIB + 1, 81)];
    holder.push(kept, values[0].clone()).await;
    holder.push(freed, values[1].clone()).await;
    let runner = Runner::start(&mut head, dir.path()).await;
    head.leave_out_copies(freed, "object 8.1 was freed");

    let given = vec![
        located(kept, &values[0], vec![copy_at(&holder, holder.read(kept))]),
        located(
            freed,
            &values[1],
            vec![copy_at(&holder, holder.read(freed))],
        ),
    ];
    let done = runner.run(&mut head, 1, &[kept, freed], given).await;
    let whole = |id: ObjectId, v: &Bytes| (id.to_string(), v.len() as u64, crc32c::crc32c(v));
    assert_eq!(
        returned(&done),
        vec![whole(kept, &values[0]), whole(freed, &values[1])],
        "the task read both whole"
    );
    assert_eq!(head.sealed(), vec![(kept, runner.node)]);

    // The recorded copy is served; the one left out is gone from the store.
    let read = |id: ObjectId| {
        ObjectTicket {
            node: runner.node,
            access: ObjectAccess::Read,
            objects: vec![id],
            expiry_ms: now_ms() + 60_000,
            namespace: Some("team".into()),
        }
        .sign(&runner.key)
    };
    let got = client_fetch(&runner.address, &read(kept), kept)
        .await
        .unwrap();
    assert_eq!(got, values[0]);
    let e = client_fetch(&runner.address, &read(freed), freed)
        .await
        .unwrap_err();
    assert_eq!(e.code(), Some(Code::NotFound), "{e}");
    runner.worker.stop().await.unwrap();
}

/// A task reads a fetched argument as soon as its copy is sealed and checked: the copy's
/// report to the head is not on its path (the fake head answers it only once the task has
/// read the bytes). The task's end still waits for the answer, so the head knows the copy
/// when it learns the task ended.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_task_reads_its_fetched_argument_before_the_head_answers_the_copy_report() {
    let mut holders_head = FakeHead::start(Duration::from_millis(200)).await;
    holders_head.number_nodes_from(50);
    let mut head = FakeHead::start(Duration::from_millis(200)).await;
    let dir = tempfile::tempdir().unwrap();
    let holder = WorkerProcess::start(&mut holders_head, dir.path(), "holder", 64 << 20).await;
    let id = ObjectId(9, 0);
    let value = data(4 * MIB, 90);
    holder.push(id, value.clone()).await;
    let runner = Runner::start(&mut head, dir.path()).await;
    head.hold_copy_reports(Arc::clone(&runner.read));

    let given = vec![located(id, &value, vec![copy_at(&holder, holder.read(id))])];
    let done = runner
        .run_function(&mut head, "read_args_and_say", 1, &[id], given)
        .await;
    let sums: Vec<u32> = match &done.outcome {
        Ok(TaskResult::Returned(bytes)) => codec::decode(bytes).unwrap(),
        other => panic!("task 1 did not return: {other:?}"),
    };
    assert_eq!(sums, vec![crc32c::crc32c(&value)], "the task read it whole");
    assert_eq!(
        head.copy_reports_held_out(),
        Vec::<ObjectId>::new(),
        "the copy's report waited for the task to read it, not the other way round"
    );
    // Its end came after the report's answer.
    assert_eq!(head.sealed(), vec![(id, runner.node)]);
    runner.worker.stop().await.unwrap();
}
