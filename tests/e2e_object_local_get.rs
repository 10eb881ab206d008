//! End to end: a `get` on the holder's own machine reads the holder's sealed file, mapped,
//! instead of fetching a copy (`Objects.Map`; docs/ARCHITECTURE.md "Objects", "Same-node
//! reads"), against real `escher-head` and `escher-worker` processes on loopback.
//!
//! The client's bytes are then the store's own pages: the test finds the address of what
//! `get` returned in its own `/proc/self/maps`, and it is a mapping of a file of the worker's
//! store directory (a fetched copy would be the client's heap). The values and checksums are
//! the put's. While the client holds the bytes the object stays pinned in the store: released
//! by its owner (the head forgets it), its file stays and the mapping still reads it whole;
//! once the bytes are dropped the store deletes it. A reader that names another machine, or
//! brings a ticket for another object, is refused and nothing is lent.

mod procs;

use escher::client::ObjectRead;
use escher::types::ObjectId;
use escher::{Client, ClientError};
use escher_proto::wire::{self, objects_client::ObjectsClient};
use procs::{ProcessCluster, WAIT, WorkerExtra, bytes_under, eventually};

/// A cluster of one worker process with its object store in a directory of its own under
/// `/dev/shm`, returned so that the test can see what the store holds.
async fn start() -> (ProcessCluster, Client, tempfile::TempDir) {
    let memory = tempfile::Builder::new()
        .prefix("escher-e2e-local-get-")
        .tempdir_in("/dev/shm")
        .expect("a directory in /dev/shm");
    let mut cluster = ProcessCluster::builder().workers(0).start().await;
    cluster.next_workers(WorkerExtra {
        args: vec![
            "--object-store-dir".into(),
            memory.path().display().to_string(),
            "--object-store-memory".into(),
            (256u64 << 20).to_string(),
        ],
        ..WorkerExtra::default()
    });
    cluster.start_worker("w1", "cpu=2,memory=512").await;
    let client = cluster.client().await;
    (cluster, client, memory)
}

/// `len` bytes that differ from one object to the next.
fn pattern(len: usize, seed: u8) -> Vec<u8> {
    (0..len)
        .map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed))
        .collect()
}

/// The file this process has mapped at `address`, from its own `/proc/self/maps` (`None`:
/// anonymous memory, a heap).
fn mapped_file(address: usize) -> Option<String> {
    let maps = std::fs::read_to_string("/proc/self/maps").unwrap();
    maps.lines().find_map(|line| {
        let mut parts = line.split_whitespace();
        let (lo, hi) = parts.next()?.split_once('-')?;
        let (lo, hi) = (
            usize::from_str_radix(lo, 16).ok()?,
            usize::from_str_radix(hi, 16).ok()?,
        );
        if !(lo..hi).contains(&address) {
            return None;
        }
        let path = parts.nth(4)?;
        Some(path.to_string())
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_get_on_the_holders_machine_maps_its_sealed_file_and_pins_it_while_mapped() {
    let (_cluster, client, shm) = start().await;
    let before = bytes_under(shm.path());
    let len = 24 << 20;
    let value = pattern(len, 7);
    let reference = client.put(value.clone()).await.unwrap();
    let id = reference.id();

    let bytes = reference.get().await.unwrap();
    assert_eq!(bytes.len(), len);
    assert_eq!(crc32c::crc32c(&bytes), crc32c::crc32c(&value));
    assert_eq!(&bytes[..], &value[..]);
    // Not a copy: the bytes are a mapping of the store's sealed file.
    let file = mapped_file(bytes.as_ptr() as usize).expect("the bytes are a file's mapping");
    assert!(
        file.starts_with(&format!("{}/", shm.path().display())) && file.contains(&id.to_string()),
        "the bytes of {id} map {file:?}, not a file of the store {}",
        shm.path().display()
    );
    // Another client of the same namespace reads it the same way, by id.
    let other = _cluster.client().await;
    let again = other.get_object(id).await.unwrap();
    assert_eq!(&again[..], &value[..]);
    assert!(mapped_file(again.as_ptr() as usize).is_some_and(|f| f == file));
    drop(again);

    // Released by its owner while mapped: the head forgets it, the store keeps its file
    // (pinned) until the last mapping goes, and the mapping still reads every byte.
    drop(reference);
    eventually("the head to forget the object", WAIT, || {
        let client = client.clone();
        async move {
            matches!(
                client.locate_object(id).await,
                Err(ClientError::NotFound(_))
            )
            .then_some(())
        }
    })
    .await;
    assert!(
        std::path::Path::new(&file).exists(),
        "{file} went while mapped"
    );
    assert!(bytes_under(shm.path()) >= before + len as u64);
    assert_eq!(crc32c::crc32c(&bytes), crc32c::crc32c(&value));
    drop(bytes);
    let path = shm.path().to_path_buf();
    eventually("the store to delete the unmapped copy", WAIT, || {
        let path = path.clone();
        async move { (bytes_under(&path) == before).then_some(()) }
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lent_file_is_the_objects_and_empty_objects_are_fetched() {
    let (_cluster, client, _shm) = start().await;
    let value = pattern(3 << 20, 11);
    let reference = client.put(value.clone()).await.unwrap();
    match client.read_object(reference.id()).await.unwrap() {
        ObjectRead::Lent(lent) => {
            assert_eq!((lent.id, lent.size), (reference.id(), value.len() as u64));
            let bytes = lent.into_bytes().unwrap();
            assert_eq!(&bytes[..], &value[..]);
        }
        ObjectRead::Fetched(_) => panic!("a holder on this machine did not lend its file"),
    }
    // Nothing to map in 0 bytes: fetched, and equal.
    let empty = client.put(Vec::new()).await.unwrap();
    match client.read_object(empty.id()).await.unwrap() {
        ObjectRead::Fetched(bytes) => assert!(bytes.is_empty()),
        ObjectRead::Lent(_) => panic!("an empty object was lent"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reader_of_another_machine_or_with_another_objects_ticket_is_lent_nothing() {
    let (_cluster, client, _shm) = start().await;
    let first = client.put(pattern(2 << 20, 1)).await.unwrap();
    let second = client.put(pattern(2 << 20, 2)).await.unwrap();
    let view = client.locate_object(first.id()).await.unwrap();
    let holder = &view.holders[0];
    let (address, ticket) = (
        holder.address.clone().unwrap(),
        holder.ticket.clone().unwrap(),
    );
    let mut rpc = ObjectsClient::connect(format!("http://{address}"))
        .await
        .unwrap();
    let boot_id = std::fs::read_to_string("/proc/sys/kernel/random/boot_id").unwrap();
    let ask = |id: ObjectId, boot_id: &str| wire::MapRequest {
        ticket: ticket.clone(),
        owner: id.owner(),
        index: id.index(),
        boot_id: boot_id.trim().to_string(),
    };

    let other = rpc
        .map(ask(first.id(), "0b7a0000-0000-4000-8000-000000000000"))
        .await
        .unwrap_err();
    assert_eq!(other.code(), tonic::Code::FailedPrecondition, "{other:?}");
    assert!(other.message().contains("another machine"), "{other:?}");
    assert!(
        other.message().contains(&first.id().to_string()),
        "{other:?}"
    );

    let wrong = rpc.map(ask(second.id(), &boot_id)).await.unwrap_err();
    assert_eq!(wrong.code(), tonic::Code::Unauthenticated, "{wrong:?}");

    // With the right ticket and machine: one grant naming a file of the object's size.
    let mut lent = rpc
        .map(ask(first.id(), &boot_id))
        .await
        .unwrap()
        .into_inner();
    let grant = lent.message().await.unwrap().expect("a grant");
    assert_eq!(grant.size, 2 << 20);
    assert_eq!(grant.crc32c, first.checksum());
}
