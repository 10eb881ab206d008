//! End to end: objects as task arguments.
//!
//! - Locality, on real `escher-head` and `escher-worker` processes: a task that takes an
//!   object as an argument runs, by default, on the node that holds a copy when that node has
//!   room, and elsewhere at once when it has none (a preference, never a wait); a task that
//!   requests the copy's location resource (hard locality) waits for that node.
//! - Fetching, on a `LocalCluster` (a real head and workers on loopback gRPC, in one process,
//!   because its workers run the test's Rust functions): a function that takes an object runs
//!   on another node, whose worker brings the object from the holder worker to worker before
//!   the handler starts, from the holder and with the ticket the task's `Assign` names (the
//!   head's `/metrics` count no `LocateObject` call); the handler reads the bytes from its own
//!   store, and the head then knows the second copy.
//! - Bad input: an unknown, freed or lost argument refuses the task, naming the object; a
//!   namespace's `put` past its byte quota is refused naming the quota, before any byte moves.

mod common;
mod procs;

use std::net::SocketAddr;

use escher::types::{Grant, NodeId, ObjectId, Role, TaskState};
use escher::{Client, ClientError, Task};
use procs::{ProcessCluster, WAIT, WorkerExtra, eventually};

/// `len` bytes that differ from one object to the next.
fn pattern(len: usize, seed: u8) -> Vec<u8> {
    (0..len)
        .map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed))
        .collect()
}

/// Real processes: `workers` workers of two cpus, each with a store of its own under
/// `/dev/shm`.
async fn processes(workers: usize) -> (ProcessCluster, Client, tempfile::TempDir) {
    processes_with(workers, &[]).await
}

/// [`processes`], the head started with `head_args` too.
async fn processes_with(
    workers: usize,
    head_args: &[&str],
) -> (ProcessCluster, Client, tempfile::TempDir) {
    let shm = tempfile::Builder::new()
        .prefix("escher-e2e-object-tasks-")
        .tempdir_in("/dev/shm")
        .expect("a directory in /dev/shm");
    let mut cluster = ProcessCluster::builder()
        .workers(0)
        .head_args(head_args)
        .start()
        .await;
    for i in 1..=workers {
        let dir = shm.path().join(format!("w{i}"));
        std::fs::create_dir_all(&dir).unwrap();
        cluster.next_workers(WorkerExtra {
            args: vec![
                "--object-store-dir".into(),
                dir.display().to_string(),
                "--object-store-memory".into(),
                (64u64 << 20).to_string(),
            ],
            ..WorkerExtra::default()
        });
        cluster.start_worker(&format!("w{i}"), "cpu=2").await;
    }
    let client = cluster.client().await;
    (cluster, client, shm)
}

/// How many `LocateObject` calls the head whose `/metrics` are at `addr` has had
/// (`escher_grpc_requests_total`; none before the first).
fn locate_calls(addr: SocketAddr, token: &str) -> f64 {
    let mut response = ureq::get(format!("http://{addr}/metrics"))
        .header("Authorization", format!("Bearer {token}"))
        .call()
        .expect("the metrics endpoint answers");
    let body = response
        .body_mut()
        .read_to_string()
        .expect("the metrics as text");
    let scrape = prometheus_parse::Scrape::parse(body.lines().map(|l| Ok(l.to_string())))
        .expect("the exposition text parses");
    scrape
        .samples
        .iter()
        .filter(|s| s.metric == "escher_grpc_requests_total")
        .filter(|s| s.labels.get("method") == Some("LocateObject"))
        .map(|s| match s.value {
            prometheus_parse::Value::Counter(v) | prometheus_parse::Value::Untyped(v) => v,
            ref other => panic!("LocateObject calls: unexpected {other:?}"),
        })
        .sum()
}

/// Where a finished task ran.
async fn ran_on(client: &Client, task: Task) -> NodeId {
    let status = client.run(task, Some(WAIT)).await.unwrap();
    assert_eq!(status.state, TaskState::Succeeded, "{status:?}");
    status.node.expect("a finished task names its node")
}

/// The node a running task is on, once it runs.
async fn running_on(client: &Client, id: escher::types::TaskId) -> NodeId {
    eventually("the task to run", WAIT, || async move {
        let info = client.task_info(id).await.ok()?;
        (info.status.state == TaskState::Running)
            .then_some(info.status.node)
            .flatten()
    })
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_task_taking_an_object_runs_where_its_copy_is_and_elsewhere_when_that_node_is_full() {
    let (_cluster, client, _shm) = processes(3).await;
    let object = client.put(pattern(1 << 20, 1)).await.unwrap();
    let holder = client.locate_object(object.id()).await.unwrap().holders[0].node;
    let quick = || Task::command(["true"]).resources_str("cpu=1");

    // Without the argument, identical tasks go round the nodes; with it, each goes to the
    // holder, which has room for each in turn.
    let mut plain = Vec::new();
    for _ in 0..3 {
        plain.push(ran_on(&client, quick()).await);
    }
    plain.sort();
    plain.dedup();
    assert!(plain.len() > 1, "plain tasks spread: {plain:?}");
    for _ in 0..4 {
        assert_eq!(ran_on(&client, quick().object_arg(&object)).await, holder);
    }

    // Fill the holder (hard locality puts the filler there).
    let location = format!("object.{}", object.id());
    let filler = client
        .submit(
            Task::command(["sleep", "600"])
                .resources_str("cpu=2")
                .resource(location.as_str(), 1),
        )
        .await
        .unwrap();
    assert_eq!(running_on(&client, filler.id()).await, holder);

    // A preferring task does not wait for the full holder: it runs elsewhere, now.
    let elsewhere = ran_on(&client, quick().object_arg(&object)).await;
    assert_ne!(elsewhere, holder);

    // A task that requests the location (hard locality) waits for the holder ...
    let hard = client
        .submit(quick().resource(location.as_str(), 1))
        .await
        .unwrap();
    let info = client.task_info(hard.id()).await.unwrap();
    assert_eq!(info.status.state, TaskState::Pending, "{info:?}");
    // ... and runs there once the filler is gone.
    client.cancel([filler.id()]).await.unwrap();
    let done = client.get(hard.id(), Some(WAIT)).await.unwrap();
    assert_eq!(
        (done.state, done.node),
        (TaskState::Succeeded, Some(holder))
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_task_whose_argument_is_unknown_freed_or_lost_is_refused_naming_the_object() {
    let (mut cluster, client, _shm) = processes(2).await;
    let unknown = ObjectId(1 << 63, 999);
    let err = client
        .submit(Task::command(["true"]).object_arg_id(unknown))
        .await
        .unwrap_err();
    assert!(err.to_string().contains(&unknown.to_string()), "{err}");

    let freed = client.put(pattern(1024, 2)).await.unwrap();
    let freed_id = freed.id();
    drop(freed);
    eventually("the release to be applied", WAIT, || {
        let client = client.clone();
        async move { client.locate_object(freed_id).await.is_err().then_some(()) }
    })
    .await;
    let err = client
        .submit(Task::command(["true"]).object_arg_id(freed_id))
        .await
        .unwrap_err();
    let text = err.to_string();
    assert!(
        text.contains(&freed_id.to_string()) && text.contains("freed"),
        "{text}"
    );

    // The holder of the only copy is killed: the object is lost, and says where and why.
    let lost = client.put(pattern(1024, 3)).await.unwrap();
    let holder = client.locate_object(lost.id()).await.unwrap().holders[0].node;
    let name = if holder == cluster.node("w1") {
        "w1"
    } else {
        "w2"
    };
    cluster.kill_worker(name);
    let err = eventually("the holder to be declared lost", WAIT, || {
        let client = client.clone();
        let lost = lost.clone();
        async move {
            client
                .submit(Task::command(["true"]).object_arg(&lost))
                .await
                .err()
                .filter(|e| e.to_string().contains("lost"))
        }
    })
    .await;
    let text = err.to_string();
    assert!(
        text.contains(&lost.id().to_string()) && text.contains(&holder.to_string()),
        "{text}"
    );
    // Reading it is refused with the typed error, naming the object, its node and why.
    match lost.get().await {
        Err(ClientError::ObjectLost { id, node, message }) => {
            assert_eq!((id, node), (lost.id(), holder));
            assert!(message.contains("lost"), "{message}");
        }
        other => panic!("expected ObjectLost, got {other:?}"),
    }
    match client
        .submit(Task::command(["true"]).object_arg(&lost))
        .await
    {
        Err(ClientError::ObjectLost { id, node, .. }) => {
            assert_eq!((id, node), (lost.id(), holder))
        }
        other => panic!("expected ObjectLost, got {other:?}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_function_reads_its_object_argument_fetched_worker_to_worker_and_the_copy_is_recorded() {
    let metrics = common::free_addr();
    let config = escher_head::HeadConfig {
        metrics: Some(metrics),
        ..escher_head::HeadConfig::default()
    };
    let cluster = common::within(
        "starting the cluster",
        common::cluster()
            .worker("cpu=4".parse().unwrap())
            .worker("cpu=4,second=1".parse().unwrap())
            .head_config(config)
            .start(),
    )
    .await
    .expect("the local cluster starts");
    let token = cluster.admin_token().to_string();
    let client = cluster.client().await.unwrap();
    for (len, seed) in [(0usize, 4u8), (1024, 5), (3 << 20, 6)] {
        let value = pattern(len, seed);
        let object = client.put(value.clone()).await.unwrap();
        let view = client.locate_object(object.id()).await.unwrap();
        assert_eq!(view.holders.len(), 1);
        let holder = view.holders[0].node;
        // The put went to the emptiest store, the first node's (the lowest id among equals,
        // each object released before the next): the task runs on the other.
        let task = Task::function_typed("object_args", &())
            .resources_str("cpu=1,second=1")
            .object_arg(&object);
        let asked = locate_calls(metrics, &token);
        let status = client.run(task, Some(common::LIMIT)).await.unwrap();
        assert_eq!(status.state, TaskState::Succeeded, "{status:?}");
        // The worker fetched from the holder the task's Assign named, asking the head nothing.
        assert_eq!(locate_calls(metrics, &token), asked, "{len} bytes");
        let ran = status.node.unwrap();
        assert_ne!(
            ran, holder,
            "the object crossed from one worker to the other"
        );
        let got: Vec<(String, u64, u32, u64)> = match status.result {
            Some(escher::types::TaskResult::Returned(bytes)) => {
                escher::codec::decode(&bytes).unwrap()
            }
            other => panic!("{other:?}"),
        };
        assert_eq!(
            got,
            vec![(
                object.id().to_string(),
                len as u64,
                crc32c::crc32c(&value),
                ran.0
            )]
        );
        // The node it ran on now holds a copy too, and carries its location.
        let view = client.locate_object(object.id()).await.unwrap();
        let mut holders: Vec<NodeId> = view.holders.iter().map(|h| h.node).collect();
        holders.sort();
        let mut want = vec![holder, ran];
        want.sort();
        want.dedup();
        assert_eq!(holders, want, "{len} bytes");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_put_past_its_namespaces_byte_quota_is_refused_naming_the_quota() {
    let (_cluster, admin, _shm) = processes_with(1, &["--namespace-object-bytes", "3000000"]).await;
    let grant = Grant::new(Role::App, Some("team".parse().unwrap())).unwrap();
    let token = admin.create_token(grant, "quota").await.unwrap().token;
    let team = admin.clone().with_token(token);
    let kept = team.put(pattern(2 << 20, 7)).await.unwrap();
    let err = team.put(pattern(1 << 20, 8)).await.unwrap_err();
    let text = err.to_string();
    assert!(
        text.contains("--namespace-object-bytes") && text.contains("team"),
        "{text}"
    );
    // The admin's objects are not counted; and once released, the team's bytes come back.
    admin.put(pattern(2 << 20, 9)).await.unwrap();
    drop(kept);
    eventually("the release to free the quota", WAIT, || {
        let team = team.clone();
        async move { team.put(pattern(1 << 20, 10)).await.ok() }
    })
    .await;
}
