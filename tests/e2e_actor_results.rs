//! End to end: an actor call's large result kept where it was made (docs/ARCHITECTURE.md
//! "Objects"; issue 44).
//!
//! On a `LocalCluster` of two workers (a real head and real workers on loopback gRPC in one
//! process, since the workers run this test's Rust actor class and function):
//!
//! - A call made with `ActorHandle::call_object` whose result is above the inline threshold
//!   (100 KiB) gets an object reference back: the head's table names the actor's node as the
//!   only holder and the caller's object session as the owner, the bytes read back are the
//!   method's, and a task on the other worker given the reference reads it there (fetched
//!   worker to worker: that node holds a copy afterwards).
//! - A result at the threshold comes back inline, with no object made; `call_raw` still
//!   returns a large result inline.
//! - Dropping the reference releases the object: it leaves the head's table.

mod common;

use escher::types::{NodeId, ObjectOwner, TaskState};
use escher::{ActorClass, CallResult, Client, Functions, LocalCluster, Task};

/// `len` bytes that differ with `seed`.
fn pattern(len: usize, seed: u8) -> Vec<u8> {
    (0..len)
        .map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed))
        .collect()
}

/// `Maker()`: `make((len, seed))` returns [`pattern`]`(len, seed)` (encoded as a typed method's
/// result is).
fn maker() -> ActorClass {
    struct Maker;
    ActorClass::new("Maker", |_ctx, (): ()| async move { Ok(Maker) })
        .method("make", |_m: &mut Maker, (len, seed): (u64, u8)| {
            Ok(pattern(len as usize, seed))
        })
}

/// The functions of [`common::functions`], and `crc`: the CRC-32C of its one object argument,
/// read from its node's store.
fn functions() -> Functions {
    common::functions()
        .actor(maker())
        .function("crc", |ctx, _args| async move {
            let arg = ctx.object_args().first().ok_or("no object argument")?;
            escher::codec::encode(&crc32c::crc32c(arg.as_slice())).map_err(|e| e.to_string())
        })
}

async fn start() -> (LocalCluster, Client) {
    let cluster = common::within(
        "starting the cluster",
        common::cluster()
            .functions(functions())
            .worker("cpu=4,a=1".parse().unwrap())
            .worker("cpu=4,b=1".parse().unwrap())
            .start(),
    )
    .await
    .expect("the local cluster starts");
    let client = cluster.client().await.unwrap();
    (cluster, client)
}

fn args(len: usize, seed: u8) -> bytes::Bytes {
    escher::codec::encode(&(len as u64, seed)).unwrap().into()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_large_actor_result_stays_on_the_actors_node_and_is_passed_by_reference() {
    let (_cluster, client) = start().await;
    let maker = common::within(
        "create",
        client.actor(Task::actor_typed("Maker", &()).resources_str("cpu=1,a=1")),
    )
    .await
    .unwrap();
    let want = escher::codec::encode(&pattern(1 << 20, 5)).unwrap();

    let kept = common::within("a large call", maker.call_object("make", args(1 << 20, 5)))
        .await
        .unwrap();
    let object = match kept {
        CallResult::Object(object) => object,
        CallResult::Bytes(b) => panic!("a 1 MiB result came back inline ({} bytes)", b.len()),
    };
    let actor_node = maker.describe().await.unwrap().node.expect("it runs");
    let view = client.locate_object(object.id()).await.unwrap();
    let holders: Vec<NodeId> = view.holders.iter().map(|h| h.node).collect();
    assert_eq!(holders, vec![actor_node]);
    assert_eq!(view.size, want.len() as u64);
    assert_eq!(view.checksum, crc32c::crc32c(&want));
    assert!(
        matches!(view.owner, ObjectOwner::Session(s) if s == object.id().owner()),
        "{:?}",
        view.owner
    );
    assert_eq!(object.get().await.unwrap(), want);

    // Given to a task on the other worker, which reads it from its own node's store.
    let task = Task::function("crc", Vec::new())
        .resources_str("cpu=1,b=1")
        .object_arg(&object);
    let submitted = client.submit(task).await.unwrap();
    let status = common::finished(&client, submitted.id()).await;
    assert_eq!(status.state, TaskState::Succeeded, "{status:?}");
    let ran = status.node.unwrap();
    assert_ne!(ran, actor_node);
    let crc: u32 = client
        .get_typed(submitted.id(), Some(common::LIMIT))
        .await
        .unwrap();
    assert_eq!(crc, crc32c::crc32c(&want));
    let holders: Vec<NodeId> = client
        .locate_object(object.id())
        .await
        .unwrap()
        .holders
        .iter()
        .map(|h| h.node)
        .collect();
    assert!(holders.contains(&ran), "{holders:?}");

    // At the threshold a result comes back inline; call_raw keeps every result inline.
    let before = client.list_objects().await.unwrap().len();
    // The length prefix of an encoded Vec<u8> of about 100 KiB.
    let prefix = escher::codec::encode(&pattern(100 << 10, 0)).unwrap().len() - (100 << 10);
    let small = maker
        .call_object("make", args((100 << 10) - prefix, 6))
        .await
        .unwrap();
    match &small {
        CallResult::Bytes(b) => assert_eq!(b.len(), 100 << 10),
        CallResult::Object(o) => panic!("a 100 KiB result was kept as object {}", o.id()),
    }
    let raw = maker.call_raw("make", args(1 << 20, 5)).await.unwrap();
    assert_eq!(raw, want);
    assert_eq!(client.list_objects().await.unwrap().len(), before);

    // Dropped: released, and gone from the head's table.
    let id = object.id();
    drop(object);
    common::eventually("the object to be released", || {
        let client = client.clone();
        async move {
            let listed = client.list_objects().await.unwrap();
            (!listed.iter().any(|o| o.id == id)).then_some(())
        }
    })
    .await;
}
