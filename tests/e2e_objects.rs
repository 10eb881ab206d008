//! End to end: objects through real `escher-head` and `escher-worker` processes on loopback.
//! A `put` goes to a worker's store over its data plane and is recorded by the head, which
//! publishes the copy's location as the resource `object.O` (`NS/object.O` in a namespace) on
//! the holder's node; a `get` fetches the bytes from the holder, checked against the length and
//! CRC-32C the head recorded. Dropping the last reference releases the object: its copy leaves
//! the store and its location resource goes. Another namespace's object is unknown; unknown and
//! freed ids are refused with errors that name them.
//!
//! The larger cases docs/python.md promises: a 1 GiB put and get (checksums compared); a store far smaller
//! than what is put (`--object-store-memory`), whose cold objects spill to its disk directory
//! and are restored on demand, every byte checked, and which returns to its start (memory and
//! disk) once they are released; reference counting over a workload of two clients, reads,
//! clones and tasks (every store's bytes and every location resource return to their start);
//! and a three-replica head whose leader is SIGKILLed while readers fetch (no read returns
//! other bytes, every object is read whole after the failover, the new leader releases them).

mod procs;

use escher::types::{Grant, ObjectId, Role};
use escher::{Client, ClientError};
use procs::{ProcessCluster, WAIT, WorkerExtra, bytes_under, eventually};

/// A cluster of `workers` worker processes, each with its object store in a directory of its
/// own under `/dev/shm` (a tmpfs), returned so that the test can see what the stores hold.
async fn start(workers: usize) -> (ProcessCluster, Client, tempfile::TempDir) {
    let (cluster, client, stores) = start_with(Setup {
        workers,
        ..Setup::default()
    })
    .await;
    (cluster, client, stores.memory)
}

/// What [`start_with`] starts.
struct Setup {
    workers: usize,
    /// Each worker's `--object-store-memory`.
    capacity: u64,
    /// Head replicas (a raft group from 3).
    heads: usize,
}

impl Default for Setup {
    fn default() -> Self {
        Setup {
            workers: 1,
            capacity: 256 << 20,
            heads: 1,
        }
    }
}

/// Where the stores keep their bytes: `memory/wN` (`--object-store-dir`, under `/dev/shm`) and
/// `spill/wN` (`--object-spill-dir`, on disk).
struct Stores {
    memory: tempfile::TempDir,
    spill: tempfile::TempDir,
}

/// [`start`], as `setup` says, each worker spilling to a directory of its own too.
async fn start_with(setup: Setup) -> (ProcessCluster, Client, Stores) {
    let memory = tempfile::Builder::new()
        .prefix("escher-e2e-objects-")
        .tempdir_in("/dev/shm")
        .expect("a directory in /dev/shm");
    let spill = tempfile::Builder::new()
        .prefix("escher-e2e-objects-spill-")
        .tempdir_in(std::env::var_os("CARGO_TARGET_TMPDIR").unwrap_or_else(|| "/var/tmp".into()))
        .expect("a directory on disk");
    let mut cluster = ProcessCluster::builder()
        .heads(setup.heads)
        .workers(0)
        .start()
        .await;
    for i in 1..=setup.workers {
        let dir = memory.path().join(format!("w{i}"));
        let spill_dir = spill.path().join(format!("w{i}"));
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::create_dir_all(&spill_dir).unwrap();
        cluster.next_workers(WorkerExtra {
            args: vec![
                "--object-store-dir".into(),
                dir.display().to_string(),
                "--object-store-memory".into(),
                setup.capacity.to_string(),
                "--object-spill-dir".into(),
                spill_dir.display().to_string(),
            ],
            ..WorkerExtra::default()
        });
        cluster
            .start_worker(&format!("w{i}"), "cpu=2,memory=512")
            .await;
    }
    let client = cluster.client().await;
    (cluster, client, Stores { memory, spill })
}

/// `len` bytes that differ from one object to the next.
fn pattern(len: usize, seed: u8) -> Vec<u8> {
    (0..len)
        .map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed))
        .collect()
}

/// The nodes that carry resource `name`.
async fn carriers(client: &Client, name: &str) -> Vec<escher::types::NodeId> {
    let status = client.cluster_status().await.unwrap();
    status
        .nodes
        .iter()
        .filter(|n| n.alive && n.resources.iter().any(|r| r.name.as_str() == name))
        .map(|n| n.id)
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn put_and_get_of_0_b_1_kib_and_1_mib_round_trip_checked_and_published_as_resources() {
    let (_cluster, client, _shm) = start(2).await;
    for (len, seed) in [(0usize, 1u8), (1024, 2), (1 << 20, 3)] {
        let value = pattern(len, seed);
        let reference = client.put(value.clone()).await.unwrap();
        assert_eq!(reference.size(), len as u64);
        assert_eq!(reference.checksum(), crc32c::crc32c(&value));
        // The worker runs on this machine: it took the put as a sealed memfd.
        assert!(reference.handed_over(), "{len} bytes");
        let back = reference.get().await.unwrap();
        assert_eq!(back.len(), len);
        assert_eq!(crc32c::crc32c(&back), crc32c::crc32c(&value), "{len} bytes");
        assert_eq!(&back[..], &value[..]);

        // The head knows where it is, and publishes it as a resource on that node only.
        let view = client.locate_object(reference.id()).await.unwrap();
        assert_eq!(
            (view.size, view.checksum),
            (len as u64, reference.checksum())
        );
        assert_eq!(view.holders.len(), 1);
        let holder = view.holders[0].node;
        let name = format!("object.{}", reference.id());
        assert_eq!(carriers(&client, &name).await, vec![holder]);
        // Another client of the same namespace reads it by id.
        let other = _cluster.client().await;
        let again = other.get_object(reference.id()).await.unwrap();
        assert_eq!(&again[..], &value[..]);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_put_the_worker_cannot_take_as_a_file_is_streamed_instead() {
    use std::io::Write as _;
    let (_cluster, client, shm) = start(1).await;
    let before = bytes_under(shm.path());
    for (len, seed) in [(0usize, 4u8), (1024, 5), (3 << 20, 6)] {
        let value = pattern(len, seed);
        let placed = client.place_put(len as u64).await.unwrap();
        let name = placed.handover_name().expect("a worker on this machine");
        // Named right but never sealed: the worker refuses it, the client streams its bytes.
        let mut file = escher::client::objects::new_memfd(&name).unwrap();
        file.write_all(&value).unwrap();
        let reference = client.put_placed_file(placed, &file, None).await.unwrap();
        assert!(!reference.handed_over(), "{len} bytes");
        assert_eq!(reference.checksum(), crc32c::crc32c(&value));
        assert_eq!(&reference.get().await.unwrap()[..], &value[..]);
        // Sealed, it is taken as it is.
        let placed = client.place_put(len as u64).await.unwrap();
        let name = placed.handover_name().unwrap();
        let mut file = escher::client::objects::new_memfd(&name).unwrap();
        file.write_all(&value).unwrap();
        escher::client::objects::seal(&file).unwrap();
        let sealed = client
            .put_placed_file(placed, &file, Some(crc32c::crc32c(&value)))
            .await
            .unwrap();
        drop(file);
        assert!(sealed.handed_over(), "{len} bytes");
        assert_eq!(&sealed.get().await.unwrap()[..], &value[..]);
    }
    // Released, every copy goes: the store is back to where it started.
    let path = shm.path().to_path_buf();
    eventually("the store emptied", WAIT, || {
        let path = path.clone();
        async move { (bytes_under(&path) == before).then_some(()) }
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dropped_reference_frees_the_object_its_copy_and_its_location() {
    let (_cluster, client, shm) = start(1).await;
    let before = bytes_under(shm.path());
    let reference = client.put(pattern(1 << 20, 9)).await.unwrap();
    let id = reference.id();
    let name = format!("object.{id}");
    assert!(bytes_under(shm.path()) >= before + (1 << 20));
    assert_eq!(carriers(&client, &name).await.len(), 1);
    let clone = reference.clone();
    drop(reference);
    // A clone keeps it.
    assert_eq!(clone.get().await.unwrap().len(), 1 << 20);
    drop(clone);

    let err = eventually("the object to be freed", WAIT, || {
        let client = client.clone();
        // (A read that located the copy just before the release may find it deleted: that
        // answer names the object too, but the head's answer is the one awaited.)
        async move {
            client
                .get_object(id)
                .await
                .err()
                .filter(|e| matches!(e, ClientError::NotFound(_)))
        }
    })
    .await;
    let text = err.to_string();
    assert!(
        text.contains(&id.to_string()) && text.contains("freed"),
        "{text}"
    );
    assert!(matches!(err, ClientError::NotFound(_)), "{err:?}");
    eventually("the store's bytes to return", WAIT, || async {
        (bytes_under(shm.path()) <= before).then_some(())
    })
    .await;
    assert!(carriers(&client, &name).await.is_empty());
    // Released again by hand: nothing left to do, and the id is not unknown either.
    assert_eq!(client.release_objects(&[id]).await.unwrap(), vec![]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unknown_ids_and_another_namespaces_objects_are_refused_naming_the_object() {
    let (_cluster, admin, _shm) = start(1).await;
    let token = |ns: &str| {
        let admin = admin.clone();
        let grant = Grant::new(Role::App, Some(ns.parse().unwrap())).unwrap();
        async move { admin.create_token(grant, "objects").await.unwrap().token }
    };
    let a = admin.clone().with_token(token("team-a").await);
    let b = admin.clone().with_token(token("team-b").await);

    let never = ObjectId(1 << 63, 12_345);
    let err = admin.get_object(never).await.unwrap_err();
    assert!(matches!(err, ClientError::NotFound(_)), "{err:?}");
    assert!(
        err.to_string().contains("unknown object") && err.to_string().contains(&never.to_string())
    );

    let secret = a.put(b"team a's bytes".to_vec()).await.unwrap();
    let id = secret.id();
    assert_eq!(&a.get_object(id).await.unwrap()[..], b"team a's bytes");
    // Its location is qualified with its namespace.
    assert_eq!(
        carriers(&admin, &format!("team-a/object.{id}")).await.len(),
        1
    );
    // Team b does not see it, cannot read it and cannot release it.
    let err = b.get_object(id).await.unwrap_err();
    assert!(
        err.to_string().contains(&format!("unknown object {id}")),
        "{err}"
    );
    assert!(b.list_objects().await.unwrap().is_empty());
    assert_eq!(b.release_objects(&[id]).await.unwrap(), vec![id]);
    assert_eq!(a.list_objects().await.unwrap().len(), 1);
    // A read ticket for team a's object does not read another: the worker checks it.
    let view = a.locate_object(id).await.unwrap();
    let holder = &view.holders[0];
    let stolen = escher::client::objects::fetch_object(
        holder.address.as_deref().unwrap(),
        holder.ticket.as_deref().unwrap(),
        ObjectId(id.owner(), id.index() + 1),
    )
    .await
    .unwrap_err();
    assert!(
        stolen.to_string().contains("does not name object"),
        "{stolen}"
    );
    // The admin sees every namespace's objects.
    assert!(
        admin
            .list_objects()
            .await
            .unwrap()
            .iter()
            .any(|v| v.id == id)
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_local_cluster_puts_gets_and_releases_objects_too() {
    let cluster = escher::LocalCluster::builder()
        .workers(2)
        .start()
        .await
        .unwrap();
    let client = cluster.client().await.unwrap();
    let value = pattern(1 << 20, 5);
    let data = client.put(value.clone()).await.unwrap();
    let id = data.id();
    assert_eq!(&data.get().await.unwrap()[..], &value[..]);
    assert_eq!(&client.get_object(id).await.unwrap()[..], &value[..]);
    let view = client.locate_object(id).await.unwrap();
    assert_eq!(view.holders.len(), 1);
    drop(data);
    let err = eventually("the object to be freed", WAIT, || {
        let client = client.clone();
        // (A read that located the copy just before the release may find it deleted: that
        // answer names the object too, but the head's answer is the one awaited.)
        async move {
            client
                .get_object(id)
                .await
                .err()
                .filter(|e| matches!(e, ClientError::NotFound(_)))
        }
    })
    .await;
    assert!(err.to_string().contains("freed"), "{err}");
    cluster.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn escher_objects_lists_each_object_with_where_it_is() {
    let (cluster, client, _shm) = start(1).await;
    let kept = client.put(pattern(4096, 4)).await.unwrap();
    let node = client.locate_object(kept.id()).await.unwrap().holders[0].node;
    let run = |json: bool| {
        let mut command = std::process::Command::new(procs::binary("escher"));
        command
            .arg("objects")
            .env("ESCHER_HOME", cluster.dir().join("escher-home"))
            .env_remove("ESCHER_HEAD")
            .env_remove("ESCHER_TOKEN")
            .env_remove("ESCHER_ACCESS_FILE");
        if json {
            command.arg("--json");
        }
        let out = command.output().expect("the escher CLI runs");
        assert!(out.status.success(), "{out:?}");
        String::from_utf8(out.stdout).unwrap()
    };
    let text = run(false);
    assert!(
        text.contains("OBJECT") && text.contains(&kept.id().to_string()),
        "{text}"
    );
    assert!(
        text.contains("4096") && text.contains(&format!("node {node}")),
        "{text}"
    );
    let rows: serde_json::Value = serde_json::from_str(&run(true)).unwrap();
    assert_eq!(rows[0]["id"], kept.id().to_string());
    assert_eq!(rows[0]["size"], 4096);
    assert_eq!(rows[0]["holders"][0], node.0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn put_and_get_of_1_gib_round_trip_checked() {
    const GIB: usize = 1 << 30;
    let (_cluster, client, stores) = start_with(Setup {
        capacity: (GIB as u64) + (256 << 20),
        ..Setup::default()
    })
    .await;
    let value = pattern(GIB, 11);
    let checksum = crc32c::crc32c(&value);
    let reference = client.put(value).await.unwrap();
    assert_eq!(
        (reference.size(), reference.checksum()),
        (GIB as u64, checksum)
    );
    // Whole in the worker's store, in memory.
    assert!(bytes_under(stores.memory.path()) >= GIB as u64);
    let back = reference.get().await.unwrap();
    assert_eq!(back.len(), GIB);
    assert_eq!(crc32c::crc32c(&back), checksum);
    assert!(
        back.iter()
            .enumerate()
            .step_by(4099)
            .all(|(i, b)| *b == (i as u8).wrapping_mul(31).wrapping_add(11)),
        "the bytes read are the bytes put"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn under_a_small_store_cold_objects_spill_to_disk_and_are_restored_on_demand() {
    const MIB: u64 = 1 << 20;
    let (_cluster, client, stores) = start_with(Setup {
        capacity: 24 * MIB,
        ..Setup::default()
    })
    .await;
    let (memory, spill) = (stores.memory.path(), stores.spill.path());
    let before = (bytes_under(memory), bytes_under(spill));
    // Five objects of 8 MiB: 40 MiB into a store of 24 MiB.
    let values: Vec<Vec<u8>> = (0..5).map(|i| pattern(8 << 20, 20 + i)).collect();
    let mut refs = Vec::new();
    for value in &values {
        refs.push(client.put(value.clone()).await.unwrap());
        assert!(
            bytes_under(memory) <= before.0 + 24 * MIB,
            "the store's memory stays within --object-store-memory: {} bytes",
            bytes_under(memory)
        );
    }
    // The cold ones went to disk.
    assert!(
        bytes_under(spill) >= before.1 + 16 * MIB,
        "{} bytes spilled",
        bytes_under(spill)
    );
    // Each read back whole, the first ones restored from disk on demand (spilling others).
    for round in 0..2 {
        for (reference, value) in refs.iter().zip(&values) {
            let back = reference.get().await.unwrap();
            assert_eq!(
                crc32c::crc32c(&back),
                crc32c::crc32c(value),
                "round {round}, object {}",
                reference.id()
            );
            assert_eq!(&back[..], &value[..]);
            assert!(bytes_under(memory) <= before.0 + 24 * MIB);
        }
    }
    // A value larger than memory and spilling allow is refused, naming the object and the flag;
    // nothing of it is left.
    let err = client.put(pattern(32 << 20, 1)).await.unwrap_err();
    let text = err.to_string();
    assert!(text.contains("object-store-memory"), "{text}");
    // Released: memory and disk both return to their start.
    drop(refs);
    eventually(
        "the store's memory and spill bytes to return",
        WAIT,
        || async {
            (bytes_under(memory) <= before.0 && bytes_under(spill) <= before.1).then_some(())
        },
    )
    .await;
    assert!(client.list_objects().await.unwrap().is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reference_counting_returns_every_store_to_its_start_after_a_workload() {
    let (cluster, client, stores) = start_with(Setup {
        workers: 2,
        ..Setup::default()
    })
    .await;
    let memory = stores.memory.path();
    let before = bytes_under(memory);
    let other = cluster.client().await;
    // Objects of 0 B to 3 MiB from two clients, read by each other, cloned and dropped in
    // another order than they were made, some given to tasks (placed at their copies).
    let mut ours = Vec::new();
    let mut theirs = Vec::new();
    for i in 0..24u32 {
        let len = (i as usize * 131_071) % (3 << 20);
        let value = pattern(len, i as u8);
        let (owner, reader) = if i % 2 == 0 {
            (&client, &other)
        } else {
            (&other, &client)
        };
        let reference = owner.put(value.clone()).await.unwrap();
        let back = reader.get_object(reference.id()).await.unwrap();
        assert_eq!(&back[..], &value[..]);
        if i % 2 == 0 {
            ours.push(reference);
        } else {
            theirs.push(reference);
        }
    }
    for reference in ours.iter().take(4) {
        let task = escher::Task::command(["true"])
            .resources_str("cpu=1")
            .object_arg(reference);
        let status = client.run(task, Some(WAIT)).await.unwrap();
        assert_eq!(
            status.state,
            escher::types::TaskState::Succeeded,
            "{status:?}"
        );
    }
    let clones: Vec<_> = theirs.iter().rev().cloned().collect();
    assert!(bytes_under(memory) > before);
    // Half released: their copies go, the others stay.
    drop(theirs);
    let kept: u64 = ours.iter().map(escher::ObjectRef::size).sum();
    assert!(
        bytes_under(memory) >= before + kept,
        "the objects still referenced keep their copies"
    );
    drop(clones);
    eventually("the released half to leave the stores", WAIT, || async {
        (bytes_under(memory) <= before + kept).then_some(())
    })
    .await;
    assert_eq!(other.list_objects().await.unwrap().len(), ours.len());
    drop(ours);
    eventually(
        "every store's bytes to return to their start",
        WAIT,
        || async { (bytes_under(memory) <= before).then_some(()) },
    )
    .await;
    assert!(client.list_objects().await.unwrap().is_empty());
    let status = client.cluster_status().await.unwrap();
    assert!(
        status
            .nodes
            .iter()
            .flat_map(|n| &n.resources)
            .all(|r| !r.name.as_str().contains("object.")),
        "no location resource is left: {:?}",
        status.nodes
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_three_replica_heads_leader_killed_during_fetches_loses_and_corrupts_nothing() {
    let (mut cluster, client, _stores) = start_with(Setup {
        heads: 3,
        ..Setup::default()
    })
    .await;
    let values: Vec<Vec<u8>> = (0..4).map(|i| pattern(16 << 20, 40 + i)).collect();
    let mut refs = Vec::new();
    for value in &values {
        refs.push(client.put(value.clone()).await.unwrap());
    }
    let ids: Vec<ObjectId> = refs.iter().map(|r| r.id()).collect();
    let checksums: Vec<u32> = values.iter().map(|v| crc32c::crc32c(v)).collect();
    // Readers fetch the objects over and over while the leader is killed: each read is whole
    // and checked, or an error; none returns other bytes.
    use std::sync::Arc;
    use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
    let stop = Arc::new(AtomicBool::new(false));
    let whole: Arc<[AtomicU32; 2]> = Arc::new([AtomicU32::new(0), AtomicU32::new(0)]);
    let mut readers = Vec::new();
    for r in 0..2 {
        let reader = cluster.client().await;
        let (ids, checksums, stop, whole) =
            (ids.clone(), checksums.clone(), stop.clone(), whole.clone());
        readers.push(tokio::spawn(async move {
            let mut failed = Vec::new();
            let mut i = r;
            while !stop.load(Ordering::Relaxed) {
                let k = i % ids.len();
                match reader.get_object(ids[k]).await {
                    Ok(bytes) => {
                        assert_eq!(bytes.len(), 16 << 20, "object {}", ids[k]);
                        assert_eq!(crc32c::crc32c(&bytes), checksums[k], "object {}", ids[k]);
                        whole[r].fetch_add(1, Ordering::Relaxed);
                    }
                    Err(e) => failed.push(e.to_string()),
                }
                i += 1;
            }
            failed
        }));
    }
    let read_by_each = |at_least: [u32; 2]| {
        let whole = whole.clone();
        async move {
            (whole[0].load(Ordering::Relaxed) >= at_least[0]
                && whole[1].load(Ordering::Relaxed) >= at_least[1])
                .then_some(())
        }
    };
    eventually("each reader to read an object whole", WAIT, || {
        read_by_each([1, 1])
    })
    .await;
    let leader = cluster.wait_leader().await;
    cluster.kill_head_at(leader);
    let before = [
        whole[0].load(Ordering::Relaxed),
        whole[1].load(Ordering::Relaxed),
    ];
    let next = cluster.wait_leader().await;
    assert_ne!(next, leader);
    // After the failover every object is still whole in the table and readable.
    for (id, value) in ids.iter().zip(&values) {
        let back = eventually("a read after the failover", WAIT, || {
            let client = client.clone();
            async move { client.get_object(*id).await.ok() }
        })
        .await;
        assert_eq!(&back[..], &value[..]);
    }
    // The readers that ran through the failover read on, whole.
    eventually(
        "each reader to read whole again after the failover",
        WAIT,
        || read_by_each([before[0] + 1, before[1] + 1]),
    )
    .await;
    stop.store(true, Ordering::Relaxed);
    for reader in readers {
        for why in reader.await.unwrap() {
            // A read that failed said why: the head it asked went away, never a bad object.
            assert!(
                !why.contains("checksum") && !why.contains("unknown object"),
                "{why}"
            );
        }
    }
    // The new leader records new objects and releases old ones.
    let fresh = client.put(pattern(1 << 20, 99)).await.unwrap();
    assert_eq!(fresh.get().await.unwrap().len(), 1 << 20);
    drop(refs);
    drop(fresh);
    eventually(
        "the objects to be released by the new leader",
        WAIT,
        || async { client.list_objects().await.ok()?.is_empty().then_some(()) },
    )
    .await;
}
