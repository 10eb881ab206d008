//! End to end: a task's result as an object, and lineage (docs/ARCHITECTURE.md "Objects").
//!
//! On a `LocalCluster` (a real head, with its raft log on disk, and real workers on loopback
//! gRPC in one process, because the workers run this test's Rust functions; a worker is killed
//! abruptly, as if its machine died, and the head finds out by its heartbeat timeout):
//!
//! - A function's 1 MiB result stays in the store of the worker that made it: the task's status
//!   carries only its size and CRC-32C, the head's object table names that worker as the
//!   holder, the head's log on disk does not carry the bytes, and `get_bytes` reads it from
//!   the holder; a small result still travels inline.
//! - A chain of tasks, each taking the previous one's 1 MiB result as its argument, on
//!   alternating workers: each result crosses worker to worker.
//! - Lineage: the only holder killed, a task that may be retried runs again under the same
//!   object id and the reader waiting gets the rebuilt bytes (checksum equal); a task given
//!   that object as its argument meanwhile waits for the rebuilt copy and runs once; a task
//!   with no retry left gives `ObjectLost` naming the object, its node and why.
//! - Release: dropping the owning reference deletes the copy from the worker's store.
//! - Sessions, through the blocking client: a task submitted after the client's first `put`
//!   belongs to its object session, and `close_object_session()` releases its result with the
//!   `put`; a task submitted before (no session yet) keeps its result.

mod common;

use std::path::Path;
use std::time::Duration;

use escher::types::{NodeId, ObjectId, ObjectOwner, TaskId, TaskResult, TaskState};
use escher::{Client, ClientError, Functions, LocalCluster, Task};

/// `len` bytes that differ with `seed`.
fn pattern(len: usize, seed: u8) -> Vec<u8> {
    (0..len)
        .map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed))
        .collect()
}

/// The functions of [`common::functions`], and:
///
/// | name      | argument            | returns                                        |
/// |-----------|---------------------|------------------------------------------------|
/// | `pattern` | `(u64, u8)` (len, seed) | [`pattern`]`(len, seed)`, raw              |
/// | `plus_one`| one object argument | its bytes each plus one (wrapping), raw        |
/// | `slow_pattern` | as `pattern` | the same, 2 s late from its second attempt on |
fn functions() -> Functions {
    common::functions()
        .function("pattern", |_ctx, args: Vec<u8>| async move {
            let (len, seed): (u64, u8) = escher::codec::decode(&args).map_err(|e| e.to_string())?;
            Ok(pattern(len as usize, seed))
        })
        .function("slow_pattern", |ctx, args: Vec<u8>| async move {
            let (len, seed): (u64, u8) = escher::codec::decode(&args).map_err(|e| e.to_string())?;
            if ctx.attempt() > 1 {
                tokio::time::sleep(Duration::from_secs(2)).await;
            }
            Ok(pattern(len as usize, seed))
        })
        .function("plus_one", |ctx, _args| async move {
            let arg = ctx.object_args().first().ok_or("no object argument")?;
            Ok(arg.as_slice().iter().map(|b| b.wrapping_add(1)).collect())
        })
}

/// A cluster of workers with `resources` each (a short heartbeat timeout, so that a killed
/// worker is declared lost within seconds), its head's log in `data`.
async fn cluster(resources: &[&str], data: &Path) -> (LocalCluster, Client) {
    let config = escher_head::HeadConfig {
        heartbeat_interval: Duration::from_millis(300),
        heartbeat_timeout: Duration::from_millis(1_500),
        ..escher_head::HeadConfig::default()
    };
    let mut builder = common::cluster()
        .functions(functions())
        .head_config(config)
        .data_dir(data);
    for r in resources {
        builder = builder.worker(r.parse().unwrap());
    }
    let cluster = common::within("starting the cluster", builder.start())
        .await
        .expect("the local cluster starts");
    let client = cluster.client().await.unwrap();
    (cluster, client)
}

fn make(len: usize, seed: u8) -> Task {
    Task::function_typed("pattern", &(len as u64, seed))
}

/// The bytes of every file under `dir`.
fn bytes_under(dir: &Path) -> u64 {
    let mut total = 0;
    for entry in std::fs::read_dir(dir).unwrap().flatten() {
        let meta = entry.metadata().unwrap();
        total += if meta.is_dir() {
            bytes_under(&entry.path())
        } else {
            meta.len()
        };
    }
    total
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_large_result_stays_on_its_worker_and_the_head_keeps_only_its_reference() {
    let data = tempfile::tempdir().unwrap();
    let (_cluster, client) = cluster(&["cpu=4", "cpu=4"], data.path()).await;
    let value = pattern(1 << 20, 1);

    let status = client
        .run(make(1 << 20, 1), Some(common::LIMIT))
        .await
        .unwrap();
    assert_eq!(status.state, TaskState::Succeeded, "{status:?}");
    let node = status.node.unwrap();
    assert_eq!(
        status.result,
        Some(TaskResult::Object {
            size: 1 << 20,
            checksum: crc32c::crc32c(&value)
        })
    );
    // The head's table: the object (task, 0), owned by the task, held by the worker that ran it.
    let id = ObjectId::task_result(status.id);
    let view = client.locate_object(id).await.unwrap();
    assert_eq!(view.owner, ObjectOwner::Task(status.id));
    let holders: Vec<NodeId> = view.holders.iter().map(|h| h.node).collect();
    assert_eq!(holders, vec![node]);
    assert!(
        client
            .list_objects()
            .await
            .unwrap()
            .iter()
            .any(|o| o.id == id)
    );
    // The bytes come from the holder, whole.
    let got = client
        .get_bytes(status.id, Some(common::LIMIT))
        .await
        .unwrap();
    assert_eq!(got, value);
    // The head's log and snapshots never carried them.
    let on_disk = bytes_under(data.path());
    assert!(on_disk < 512 << 10, "the head's data holds {on_disk} bytes");

    // At the threshold (100 KiB) a result still travels inline; one byte more is an object.
    let small = client
        .run(make(100 << 10, 2), Some(common::LIMIT))
        .await
        .unwrap();
    assert!(
        matches!(&small.result, Some(TaskResult::Returned(b)) if b.len() == 100 << 10),
        "{:?}",
        small.result.as_ref().map(ToString::to_string)
    );
    let above = client
        .run(make((100 << 10) + 1, 3), Some(common::LIMIT))
        .await
        .unwrap();
    assert!(
        matches!(above.result, Some(TaskResult::Object { size, .. }) if size == (100 << 10) + 1),
        "{:?}",
        above.result
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_chain_of_tasks_passes_large_results_worker_to_worker() {
    let data = tempfile::tempdir().unwrap();
    let (_cluster, client) = cluster(&["cpu=4,a=1", "cpu=4,b=1"], data.path()).await;
    let first = client
        .submit(make(1 << 20, 9).resources_str("cpu=1,a=1"))
        .await
        .unwrap();
    let mut reference = client
        .result_ref(first.id(), Some(common::LIMIT))
        .await
        .unwrap()
        .expect("a 1 MiB result is an object");
    let mut want = pattern(1 << 20, 9);
    let mut ran = Vec::new();
    for step in 0..4 {
        let side = if step % 2 == 0 { "b" } else { "a" };
        let task = Task::function("plus_one", Vec::new())
            .resources_str(&format!("cpu=1,{side}=1"))
            .object_arg(&reference);
        let next = client.submit(task).await.unwrap();
        let status = common::finished(&client, next.id()).await;
        assert_eq!(status.state, TaskState::Succeeded, "{status:?}");
        ran.push(status.node.unwrap());
        // The argument crossed to the node that ran the step: it holds a copy now.
        let holders: Vec<NodeId> = client
            .locate_object(reference.id())
            .await
            .unwrap()
            .holders
            .iter()
            .map(|h| h.node)
            .collect();
        assert!(holders.contains(&status.node.unwrap()), "{holders:?}");
        want.iter_mut().for_each(|b| *b = b.wrapping_add(1));
        reference = client
            .result_ref(next.id(), Some(common::LIMIT))
            .await
            .unwrap()
            .expect("an object");
    }
    // The steps alternate between the two workers, so each argument crossed from one to the
    // other.
    assert!(ran.windows(2).all(|w| w[0] != w[1]), "{ran:?}");
    let got = reference.get().await.unwrap();
    assert_eq!(crc32c::crc32c(&got), crc32c::crc32c(&want));
    assert_eq!(got.as_ref(), want.as_slice());
}

/// Waits until the head counts `node` lost. (A killed worker's listener may still answer a
/// read begun as it was killed, as a machine's may while it dies: the loss is certain only
/// once the head has counted it.)
async fn counted_lost(client: &Client, node: NodeId) {
    common::eventually("the holder counted lost", || async {
        let status = client.cluster_status().await.ok()?;
        let record = status.nodes.iter().find(|n| n.id == node)?;
        (!record.alive).then_some(())
    })
    .await;
}

/// Runs `task` to success and kills the node that holds its result object; returns the task
/// and that node.
async fn made_then_holder_killed(
    cluster: &mut LocalCluster,
    client: &Client,
    task: Task,
) -> (TaskId, NodeId) {
    let status = client.run(task, Some(common::LIMIT)).await.unwrap();
    assert_eq!(status.state, TaskState::Succeeded, "{status:?}");
    let holder = status.node.unwrap();
    cluster.kill_worker(holder);
    (status.id, holder)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lost_result_is_rebuilt_by_running_its_task_again_under_the_same_id() {
    let data = tempfile::tempdir().unwrap();
    let (mut cluster, client) = cluster(&["cpu=4", "cpu=4"], data.path()).await;
    let value = pattern(1 << 20, 21);
    let (task, lost) =
        made_then_holder_killed(&mut cluster, &client, make(1 << 20, 21).max_retries(1)).await;
    // A killed in-process worker's listener may still answer a read for a moment (as a dying
    // machine's may): a read begun then would get the first attempt's copy, and the rebuild
    // would not be what it read. Once the head counts the holder lost, the object has no copy.
    counted_lost(&client, lost).await;

    // The reader waits through the rebuild, and gets the same bytes.
    let got = common::within_for(
        Duration::from_secs(60),
        "the rebuilt result",
        client.get_bytes(task, None),
    )
    .await
    .unwrap();
    assert_eq!(crc32c::crc32c(&got), crc32c::crc32c(&value));
    assert_eq!(got, value);
    let status = client.get(task, Some(common::LIMIT)).await.unwrap();
    assert_eq!(status.state, TaskState::Succeeded, "{status:?}");
    assert_eq!(status.attempt, 2, "the second attempt rebuilt it");
    assert_ne!(status.node, Some(lost));
    let view = client
        .locate_object(ObjectId::task_result(task))
        .await
        .unwrap();
    let holders: Vec<NodeId> = view.holders.iter().map(|h| h.node).collect();
    assert_eq!(holders, vec![status.node.unwrap()]);
    assert_eq!(view.lost, None);
}

/// A task whose argument's only copy was lost waits while lineage makes it again (the rebuild
/// takes 2 s here), and then runs once on the rebuilt bytes, rather than failing for want of a
/// holder.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_task_whose_argument_is_being_rebuilt_waits_for_it_and_runs() {
    let data = tempfile::tempdir().unwrap();
    let (mut cluster, client) = cluster(&["cpu=4", "cpu=4"], data.path()).await;
    let slow = Task::function_typed("slow_pattern", &(1u64 << 20, 23u8)).max_retries(1);
    let made = client.run(slow, Some(common::LIMIT)).await.unwrap();
    assert_eq!(made.state, TaskState::Succeeded, "{made:?}");
    let reference = client
        .result_ref(made.id, Some(common::LIMIT))
        .await
        .unwrap()
        .expect("a 1 MiB result is an object");
    let lost = made.node.unwrap();
    cluster.kill_worker(lost);
    // Once the head counts the holder lost (a task placed on it before would be lost with it),
    // the argument has no copy until the rebuild ends.
    counted_lost(&client, lost).await;

    let next = client
        .submit(Task::function("plus_one", Vec::new()).object_arg(&reference))
        .await
        .unwrap();
    let status = common::within_for(
        Duration::from_secs(90),
        "the task on the rebuilt argument",
        client.get(next.id(), None),
    )
    .await
    .unwrap();
    assert_eq!(status.state, TaskState::Succeeded, "{status:?}");
    assert_eq!(status.attempt, 1, "it ran once: {status:?}");
    let rebuilt = client.get(made.id, Some(common::LIMIT)).await.unwrap();
    assert_eq!(
        rebuilt.attempt, 2,
        "the argument was made again: {rebuilt:?}"
    );
    assert_ne!(rebuilt.node, Some(lost));
    let mut want = pattern(1 << 20, 23);
    want.iter_mut().for_each(|b| *b = b.wrapping_add(1));
    let got = client.get_bytes(next.id(), None).await.unwrap();
    assert_eq!(crc32c::crc32c(&got), crc32c::crc32c(&want));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lost_result_whose_task_may_not_run_again_is_reported_lost_naming_it() {
    let data = tempfile::tempdir().unwrap();
    let (mut cluster, client) = cluster(&["cpu=4", "cpu=4"], data.path()).await;
    let (task, lost) =
        made_then_holder_killed(&mut cluster, &client, make(1 << 20, 22).max_retries(0)).await;
    counted_lost(&client, lost).await;
    let id = ObjectId::task_result(task);
    let err = common::within_for(
        Duration::from_secs(60),
        "the loss to be reported",
        client.get_bytes(task, None),
    )
    .await
    .unwrap_err();
    match &err {
        ClientError::ObjectLost {
            id: got,
            node,
            message,
        } => {
            assert_eq!((*got, *node), (id, lost));
            assert!(
                message.contains(&id.to_string()) && message.contains("no retry left"),
                "{message}"
            );
        }
        other => panic!("expected ObjectLost, got {other:?}"),
    }
    // The task itself stays succeeded: nothing ran again.
    let status = client.get(task, Some(common::LIMIT)).await.unwrap();
    assert_eq!((status.state, status.attempt), (TaskState::Succeeded, 1));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dropping_the_owning_reference_frees_the_workers_store() {
    let data = tempfile::tempdir().unwrap();
    let (_cluster, client) = cluster(&["cpu=4"], data.path()).await;
    let status = client
        .run(make(1 << 20, 23), Some(common::LIMIT))
        .await
        .unwrap();
    let reference = client
        .result_ref(status.id, Some(common::LIMIT))
        .await
        .unwrap()
        .expect("an object");
    let id = reference.id();
    // A read ticket from before the release, to ask the holder's store afterwards.
    let view = client.locate_object(id).await.unwrap();
    let holder = &view.holders[0];
    let (address, ticket) = (
        holder.address.clone().unwrap(),
        holder.ticket.clone().unwrap(),
    );
    let before = escher::client::objects::fetch_object(&address, &ticket, id)
        .await
        .unwrap();
    assert_eq!(before.len(), 1 << 20);
    drop(reference);
    common::eventually("the release to be applied", || {
        let client = client.clone();
        async move { client.locate_object(id).await.is_err().then_some(()) }
    })
    .await;
    // The holder deleted its copy: the same ticket now finds nothing.
    let err = common::eventually("the copy to be deleted", || {
        let (address, ticket) = (address.clone(), ticket.clone());
        async move {
            escher::client::objects::fetch_object(&address, &ticket, id)
                .await
                .err()
        }
    })
    .await;
    assert!(err.to_string().contains(&id.to_string()), "{err}");
    // And the task's result now reads as freed, naming the object.
    let err = client
        .get_bytes(status.id, Some(common::LIMIT))
        .await
        .unwrap_err();
    assert!(
        err.to_string().contains(&id.to_string()) && err.to_string().contains("freed"),
        "{err}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reported_copy_of_a_result_its_task_has_not_produced_is_refused_over_grpc() {
    use escher_proto::wire;
    let data = tempfile::tempdir().unwrap();
    let (_cluster, client) = cluster(&["cpu=4"], data.path()).await;
    // A real node id, from a task that ran.
    let ran = client.run(make(16, 1), Some(common::LIMIT)).await.unwrap();
    assert_eq!(ran.state, TaskState::Succeeded, "{ran:?}");
    let node = ran.node.unwrap();
    // A task no node can run: its result does not exist.
    let waiting = client
        .submit(make(1 << 20, 2).resources_str("cpu=64"))
        .await
        .unwrap()
        .id();
    let channel = tonic::transport::Endpoint::from_shared(client.head_url().to_string())
        .unwrap()
        .connect()
        .await
        .unwrap();
    let bearer = client.credentials().bearer();
    let mut raw = wire::cluster_client::ClusterClient::with_interceptor(channel, bearer);
    let fake = wire::ObjectsSealedRequest {
        copies: vec![wire::SealedObject {
            id: Some(wire::ObjectKey {
                owner: waiting.0,
                index: 0,
            }),
            size: 1 << 20,
            crc32c: 0x1234_5678,
            node: node.0,
        }],
        namespace: String::new(),
    };
    let err = raw.objects_sealed(fake).await.unwrap_err();
    assert!(
        err.message().contains("has not produced it"),
        "{}",
        err.message()
    );
    // Nothing was recorded: the object is still unknown.
    assert!(
        client
            .locate_object(ObjectId::task_result(waiting))
            .await
            .is_err()
    );
}

/// A plain thread, as a program without an async runtime is: the cluster runs on a runtime of
/// its own, the blocking client on the one it owns.
#[test]
fn the_blocking_clients_close_releases_its_puts_and_its_tasks_results() {
    let rt = tokio::runtime::Runtime::new().unwrap();
    let data = tempfile::tempdir().unwrap();
    let (cluster, _admin) = rt.block_on(cluster(&["cpu=4"], data.path()));
    let client = cluster.blocking_client().unwrap();
    // No session yet: this task's result is no session's.
    let early = client.submit(make(1 << 20, 40)).unwrap();
    let put = client.put(vec![5u8; 200 << 10]).unwrap();
    let later = client.submit(make(1 << 20, 41)).unwrap();
    for task in [early.id(), later.id()] {
        let status = client.get(task, Some(common::LIMIT)).unwrap();
        assert_eq!(status.state, TaskState::Succeeded, "{status:?}");
        assert!(
            matches!(status.result, Some(TaskResult::Object { .. })),
            "{status:?}"
        );
    }
    let later_result = ObjectId::task_result(later.id());
    assert_eq!(
        client.get_bytes(later.id(), Some(common::LIMIT)).unwrap(),
        pattern(1 << 20, 41)
    );

    let closed = client.close_object_session().unwrap();
    assert_eq!(closed.session, put.id().owner());
    assert_eq!(closed.released, vec![later_result, put.id()]);
    assert!(closed.pinned.is_empty());
    // Released at once (the reply came after the commit), though `put` is still held.
    let err = client.get_object(put.id()).unwrap_err();
    assert!(err.to_string().contains("freed"), "{err}");
    let err = client
        .get_bytes(later.id(), Some(common::LIMIT))
        .unwrap_err();
    assert!(
        err.to_string().contains(&later_result.to_string()) && err.to_string().contains("freed"),
        "{err}"
    );
    // The task from before the session keeps its result.
    assert_eq!(
        client.get_bytes(early.id(), Some(common::LIMIT)).unwrap(),
        pattern(1 << 20, 40)
    );
    // Nothing left to close.
    assert_eq!(client.close_object_session().unwrap().session, 0);
    drop((put, client));
    rt.block_on(cluster.shutdown());
}
