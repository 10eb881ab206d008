//! End to end: objects through real `escher-head` and `escher-worker` processes on loopback.
//! A `put` goes to a worker's store over its data plane and is recorded by the head, which
//! publishes the copy's location as the resource `object.O` (`NS/object.O` in a namespace) on
//! the holder's node; a `get` fetches the bytes from the holder, checked against the length and
//! CRC-32C the head recorded. Dropping the last reference releases the object: its copy leaves
//! the store and its location resource goes. Another namespace's object is unknown; unknown and
//! freed ids are refused with errors that name them.

mod procs;

use std::path::{Path, PathBuf};

use escher::types::{Grant, ObjectId, Role};
use escher::{Client, ClientError};
use procs::{ProcessCluster, WAIT, WorkerExtra, eventually};

/// A cluster of `workers` worker processes, each with its object store in a directory of its
/// own under `/dev/shm` (a tmpfs), returned so that the test can see what the stores hold.
async fn start(workers: usize) -> (ProcessCluster, Client, tempfile::TempDir) {
    let shm = tempfile::Builder::new()
        .prefix("escher-e2e-objects-")
        .tempdir_in("/dev/shm")
        .expect("a directory in /dev/shm");
    let mut cluster = ProcessCluster::builder().workers(0).start().await;
    for i in 1..=workers {
        let dir = shm.path().join(format!("w{i}"));
        std::fs::create_dir_all(&dir).unwrap();
        cluster.next_workers(WorkerExtra {
            args: vec![
                "--object-store-dir".into(),
                dir.display().to_string(),
                "--object-store-memory".into(),
                (256u64 << 20).to_string(),
            ],
            ..WorkerExtra::default()
        });
        cluster
            .start_worker(&format!("w{i}"), "cpu=2,memory=512")
            .await;
    }
    let client = cluster.client().await;
    (cluster, client, shm)
}

/// The bytes of the regular files under `dir`.
fn bytes_under(dir: &Path) -> u64 {
    let mut total = 0;
    let mut stack: Vec<PathBuf> = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        let Ok(entries) = std::fs::read_dir(&d) else {
            continue;
        };
        for e in entries.flatten() {
            let Ok(meta) = e.metadata() else { continue };
            if meta.is_dir() {
                stack.push(e.path());
            } else if meta.is_file() {
                total += meta.len();
            }
        }
    }
    total
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
