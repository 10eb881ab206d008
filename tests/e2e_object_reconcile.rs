//! End to end: a node declared lost that comes back reconciles its object store with the
//! head's table (docs/ARCHITECTURE.md "Objects", "Loss"), through real `escher-head` and worker
//! processes on loopback. The workers are the test worker `test_actor_worker` (the worker's
//! library with a function `pattern` whose large result stays in its store as an object), each
//! with a store directory of its own under `/dev/shm`, so that the test sees what the store
//! holds.
//!
//! A worker holding `put` objects and task results is SIGSTOPped past the heartbeat timeout:
//! the head declares its node lost, its only copies are reported lost, and a result whose task
//! may run again is rebuilt on the other worker. Meanwhile some objects are released. Thawed,
//! the worker attaches again and reports what its store holds: the released objects' files go
//! (the store's bytes return to what the kept ones take), the lost `put` and the lost result
//! are readable again from that node (with their checksums), and the rebuilt result, the same
//! bytes, has a second copy there.
//!
//! A head restored from a backup learns the `put` objects of a session it knew that were made
//! after the backup (the worker's report after it attaches again), and has the worker delete
//! those of a session it never gave out (its number may go to another client).

mod procs;

use std::path::Path;
use std::process::Command;

use escher::types::{NodeId, ObjectId, TaskId, TaskResult, TaskState};
use escher::{Client, ClientError, Task};
use procs::{ProcessCluster, WAIT, WorkerExtra, binary, bytes_under, eventually};

/// The size of each `put`.
const PUT: usize = 300_000;
/// The size of each task result (above the 100 KiB kept inline).
const RESULT: u64 = 400_000;

/// What the test worker's `pattern((len, seed))` returns.
fn pattern(len: u64, seed: u8) -> Vec<u8> {
    (0..len)
        .map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed))
        .collect()
}

/// A directory of its own under `/dev/shm` for a worker's store.
fn store_dir() -> tempfile::TempDir {
    tempfile::Builder::new()
        .prefix("escher-e2e-object-reconcile-")
        .tempdir_in("/dev/shm")
        .expect("a directory in /dev/shm")
}

/// Starts worker `name`, the test worker with its store in a new directory under `/dev/shm`.
async fn start_worker(cluster: &mut ProcessCluster, name: &str) -> (NodeId, tempfile::TempDir) {
    let store = store_dir();
    cluster.next_workers(WorkerExtra {
        binary: Some(procs::example("test_actor_worker")),
        args: vec![
            "--object-store-dir".into(),
            store.path().display().to_string(),
        ],
        ..WorkerExtra::default()
    });
    let node = cluster.start_worker(name, "cpu=4,memory=512").await;
    (node, store)
}

/// Runs `pattern((RESULT, seed))` with `retries`; its task id, once its result is an object.
async fn make_result(client: &Client, seed: u8, retries: u32) -> TaskId {
    let task = Task::function_typed("pattern", &(RESULT, seed)).max_retries(retries);
    let status = client.run(task, Some(WAIT)).await.expect("the task runs");
    assert_eq!(status.state, TaskState::Succeeded, "{status:?}");
    let crc = crc32c::crc32c(&pattern(RESULT, seed));
    assert_eq!(
        status.result,
        Some(TaskResult::Object {
            size: RESULT,
            checksum: crc
        })
    );
    status.id
}

/// The nodes the head names as holders of `id`, or why it names none.
async fn holders(client: &Client, id: ObjectId) -> Result<Vec<NodeId>, ClientError> {
    let view = client.locate_object(id).await?;
    let mut nodes: Vec<NodeId> = view.holders.iter().map(|h| h.node).collect();
    nodes.sort();
    Ok(nodes)
}

/// Waits until the store under `dir` holds `bytes`.
async fn store_holds(dir: &Path, bytes: u64) {
    let what = format!("the store to hold {bytes} bytes");
    eventually(&what, WAIT, || async {
        (bytes_under(dir) == bytes).then_some(())
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_back_from_the_lost_keeps_what_is_wanted_and_deletes_what_was_released() {
    let mut cluster = ProcessCluster::builder()
        .workers(0)
        .heartbeat_timeout_ms(2_000)
        .start()
        .await;
    let (w1, store1) = start_worker(&mut cluster, "w1").await;
    let client = cluster.client().await;

    // On w1, the only worker yet: two puts and three results.
    let kept = client.put(pattern(PUT as u64, 1)).await.expect("put");
    let released = client.put(pattern(PUT as u64, 2)).await.expect("put");
    let lost_result = make_result(&client, 3, 0).await;
    let released_result = make_result(&client, 4, 0).await;
    let rebuilt = make_result(&client, 5, 3).await;
    for id in [kept.id(), released.id()]
        .into_iter()
        .chain([lost_result, released_result, rebuilt].map(ObjectId::task_result))
    {
        assert_eq!(holders(&client, id).await.expect("located"), vec![w1]);
    }
    store_holds(store1.path(), 2 * PUT as u64 + 3 * RESULT).await;
    let (w2, store2) = start_worker(&mut cluster, "w2").await;

    // w1 silent past the heartbeat timeout: its node is lost, and its copies with it.
    cluster.freeze_worker("w1", true);
    eventually("w1's put to be reported lost", WAIT, || async {
        match client.locate_object(kept.id()).await {
            Err(ClientError::ObjectLost { node, .. }) if node == w1 => Some(()),
            _ => None,
        }
    })
    .await;
    let lost = client
        .locate_object(ObjectId::task_result(lost_result))
        .await;
    assert!(
        matches!(lost, Err(ClientError::ObjectLost { .. })),
        "{lost:?}"
    );
    // Lineage makes the result whose task may run again on w2.
    let bytes = client
        .result_object_bytes(rebuilt, Some(WAIT))
        .await
        .expect("the rebuilt result");
    assert_eq!(bytes.as_ref(), pattern(RESULT, 5).as_slice());
    assert_eq!(
        holders(&client, ObjectId::task_result(rebuilt))
            .await
            .unwrap(),
        vec![w2]
    );
    store_holds(store2.path(), RESULT).await;
    // Released meanwhile: no release will ever reach w1 for these.
    let unknown = client
        .release_objects(&[released.id(), ObjectId::task_result(released_result)])
        .await
        .expect("released");
    assert!(unknown.is_empty(), "{unknown:?}");

    // Back: w1 attaches again as the same node and reports its store.
    cluster.freeze_worker("w1", false);
    eventually("w1's put to be readable again", WAIT, || async {
        (holders(&client, kept.id()).await.ok()? == vec![w1]).then_some(())
    })
    .await;
    // The released copies are deleted; the lost put, the lost result and a second copy of the
    // rebuilt one stay.
    store_holds(store1.path(), PUT as u64 + 2 * RESULT).await;
    assert_eq!(
        holders(&client, ObjectId::task_result(lost_result))
            .await
            .expect("the lost result is readable again"),
        vec![w1]
    );
    eventually("the rebuilt result's second copy", WAIT, || async {
        let nodes = holders(&client, ObjectId::task_result(rebuilt))
            .await
            .ok()?;
        (nodes == vec![w1, w2]).then_some(())
    })
    .await;
    assert_eq!(cluster.node("w1"), w1);

    // What was adopted reads whole, its checksum the table's.
    let view = client.locate_object(kept.id()).await.unwrap();
    let bytes = kept.get().await.expect("the put reads again");
    assert_eq!(bytes.as_ref(), pattern(PUT as u64, 1).as_slice());
    assert_eq!(crc32c::crc32c(&bytes), view.checksum);
    let bytes = client
        .result_object_bytes(lost_result, Some(WAIT))
        .await
        .expect("the result reads again");
    assert_eq!(bytes.as_ref(), pattern(RESULT, 3).as_slice());
    let listed: Vec<ObjectId> = client
        .list_objects()
        .await
        .unwrap()
        .into_iter()
        .map(|v| v.id)
        .collect();
    assert!(!listed.contains(&released.id()), "{listed:?}");
    assert!(!listed.contains(&ObjectId::task_result(released_result)));
    // The rebuilt copy on w2 is untouched.
    assert_eq!(bytes_under(store2.path()), RESULT);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_head_restored_from_a_backup_learns_later_puts_of_its_sessions_and_drops_the_rest() {
    // A long heartbeat timeout: the node stays live through the head's stop and restore.
    let mut cluster = ProcessCluster::builder()
        .durable()
        .workers(0)
        .heartbeat_timeout_ms(60_000)
        .start()
        .await;
    let store = store_dir();
    cluster.next_workers(WorkerExtra {
        args: vec![
            "--object-store-dir".into(),
            store.path().display().to_string(),
        ],
        ..WorkerExtra::default()
    });
    let w1 = cluster.start_worker("w1", "cpu=2,memory=512").await;
    let known = cluster.client().await;
    let before = known.put(pattern(PUT as u64, 1)).await.expect("put");
    let backups = tempfile::tempdir().unwrap();
    let file = backups.path().join("cluster.backup");
    let save = Command::new(binary("escher"))
        .args(["admin", "snapshot", "save", file.to_str().unwrap()])
        .env("ESCHER_HOME", cluster.dir().join("escher-home"))
        .env_remove("ESCHER_HEAD")
        .env_remove("ESCHER_TOKEN")
        .env_remove("ESCHER_ACCESS_FILE")
        .output()
        .expect("the escher CLI runs");
    assert!(save.status.success(), "{save:?}");
    // After the backup: one more put of the same session, and one of a new client's session.
    let after = known.put(pattern(PUT as u64, 2)).await.expect("put");
    let stranger = cluster.client().await;
    let unknown = stranger.put(pattern(PUT as u64, 3)).await.expect("put");
    store_holds(store.path(), 3 * PUT as u64).await;

    cluster.terminate_head_at(0).await;
    cluster.restore_head_at(0, &file).await;
    let client = cluster.client().await;
    eventually("the later put to be known again", WAIT, || async {
        (holders(&client, after.id()).await.ok()? == vec![w1]).then_some(())
    })
    .await;
    let bytes = client
        .get_object(after.id())
        .await
        .expect("the later put reads");
    assert_eq!(bytes.as_ref(), pattern(PUT as u64, 2).as_slice());
    assert_eq!(holders(&client, before.id()).await.unwrap(), vec![w1]);
    // The other session's copy is deleted, and the restored head never heard of it.
    store_holds(store.path(), 2 * PUT as u64).await;
    let refused = client.locate_object(unknown.id()).await;
    assert!(
        matches!(refused, Err(ClientError::NotFound(_))),
        "{refused:?}"
    );
    drop((known, stranger));
}
