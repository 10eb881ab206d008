//! End to end: objects released when their owner ends, through real `escher-head`
//! and `escher-worker` processes on loopback, the head's lapse made short
//! (`--object-session-lapse`).
//!
//! A client process that puts objects and is then SIGKILLed leaks nothing: once its session
//! lapses the objects leave the table (`ListObjects`, `escher objects`) and the worker's store
//! directory. While it lives, idle, its objects stay past the lapse (its background task renews
//! the session). A client that closes its session releases every object at once. A leader
//! change gives every session a full lapse: a live client's objects stay through it, and the
//! new leader releases those of a client killed afterwards.
//!
//! The session owns the results of its client's tasks too: a client that put, then submitted
//! tasks whose results are large (kept in the worker's store as objects), and was SIGKILLed
//! leaves none of them once its session lapses, nor does one that opened its session before
//! its first task without any put (as a Python driver does); a result of a client that never
//! put (no session) stays; a result its task makes after the session lapsed is released too. Those tests run the test worker (`procs::example("test_actor_worker")`,
//! the worker library with a Rust function `bytes`), since `escher-worker` runs no Rust
//! functions.
//!
//! A client that speaks for a task of another (`Client::within_object_session`) puts into the
//! caller's session at the task's own indexes: what it drops is released, what it disowns
//! stays after it is gone, and the caller that adopts it (`Client::adopt_object`) releases it
//! with its last ref.

mod procs;

use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use escher::types::{OBJECT_SESSION_LABEL, ObjectId, ObjectOwner, TaskId, TaskResult, TaskState};
use escher::{Client, ClientError, Task};
use procs::{ProcessCluster, WAIT, WorkerExtra, bytes_under, eventually};

/// The lapse the tests' heads run with.
const LAPSE: Duration = Duration::from_secs(3);

/// A cluster of `heads` head replicas whose sessions lapse after [`LAPSE`], and one worker
/// whose object store is a directory of its own under `/dev/shm`, returned so that the test
/// can see what the store holds.
async fn start(heads: usize) -> (ProcessCluster, Client, tempfile::TempDir) {
    start_with(heads, None).await
}

/// [`start`], its worker the binary `worker` (`None`: `escher-worker`).
async fn start_with(
    heads: usize,
    worker: Option<std::path::PathBuf>,
) -> (ProcessCluster, Client, tempfile::TempDir) {
    let store = tempfile::Builder::new()
        .prefix("escher-e2e-object-sessions-")
        .tempdir_in("/dev/shm")
        .expect("a directory in /dev/shm");
    let lapse = format!("{}ms", LAPSE.as_millis());
    // The worker may take a few seconds to find a new leader (its registration backs off):
    // a heartbeat timeout that outlasts that keeps the failover test about sessions, not about
    // a node declared lost meanwhile (whose copies leave the table until it comes back and
    // reconciles its store: tests/e2e_object_reconcile.rs).
    let mut cluster = ProcessCluster::builder()
        .heads(heads)
        .workers(0)
        .heartbeat_timeout_ms(6_000)
        .head_args(&["--object-session-lapse", lapse.as_str()])
        .start()
        .await;
    cluster.next_workers(WorkerExtra {
        args: vec![
            "--object-store-dir".into(),
            store.path().display().to_string(),
        ],
        binary: worker,
        ..WorkerExtra::default()
    });
    cluster.start_worker("w1", "cpu=2,memory=512").await;
    let client = cluster.client().await;
    (cluster, client, store)
}

/// The ids the head lists, as text.
async fn listed(client: &Client) -> Vec<String> {
    let mut ids: Vec<String> = client
        .list_objects()
        .await
        .expect("ListObjects")
        .into_iter()
        .map(|v| v.id.to_string())
        .collect();
    ids.sort();
    ids
}

/// A client process (`test_object_owner`) that put objects and holds them; killed when
/// dropped.
struct Owner {
    child: Child,
    ids: Vec<String>,
}

impl Owner {
    /// Starts one that puts `count` objects of `size` bytes, and waits until it holds them.
    fn start(cluster: &ProcessCluster, count: u8, size: usize) -> Owner {
        Owner::start_args(cluster, &[count.to_string(), size.to_string()])
    }

    /// Starts one with these arguments (`COUNT SIZE [TASKS LEN]`, see the example), and waits
    /// until it holds its objects.
    fn start_args(cluster: &ProcessCluster, args: &[String]) -> Owner {
        let mut child = Command::new(procs::example("test_object_owner"))
            .args(args)
            .env("ESCHER_HEAD", cluster.head_url())
            .env("ESCHER_HOME", cluster.dir().join("escher-home"))
            .env_remove("ESCHER_TOKEN")
            .env_remove("ESCHER_ACCESS_FILE")
            .env_remove("ESCHER_NAMESPACE")
            .stdout(Stdio::piped())
            .spawn()
            .expect("the test client starts");
        let stdout = child.stdout.take().expect("its stdout");
        let mut ids = Vec::new();
        for line in BufReader::new(stdout).lines() {
            let line = line.expect("its output");
            if line == "ready" {
                ids.sort();
                return Owner { child, ids };
            }
            ids.push(line);
        }
        let status = child.wait();
        panic!("the test client ended before it held its objects: {status:?}");
    }

    /// SIGKILL: it closes nothing.
    fn kill(&mut self) {
        self.child.kill().expect("SIGKILL");
        self.child.wait().expect("reaped");
    }
}

impl Drop for Owner {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Waits until the head lists none of `ids`, then until the store holds at most `bytes`.
async fn released(client: &Client, ids: &[String], store: &Path, bytes: u64) {
    eventually("the objects to leave the table", WAIT, || async {
        let now = listed(client).await;
        (!ids.iter().any(|id| now.contains(id))).then_some(())
    })
    .await;
    eventually("the store's bytes to return", WAIT, || async {
        (bytes_under(store) <= bytes).then_some(())
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_killed_without_closing_leaks_nothing_once_its_session_lapses() {
    let (cluster, admin, store) = start(1).await;
    let before = bytes_under(store.path());
    let mut owner = Owner::start(&cluster, 3, 64 << 10);
    assert_eq!(owner.ids.len(), 3);
    assert_eq!(listed(&admin).await, owner.ids);
    assert!(bytes_under(store.path()) >= before + 3 * (64 << 10));

    // Alive and idle, it keeps them past the lapse.
    tokio::time::sleep(LAPSE * 3).await;
    assert_eq!(
        listed(&admin).await,
        owner.ids,
        "a live client's objects stay"
    );

    owner.kill();
    released(&admin, &owner.ids, store.path(), before).await;
    // `escher objects` shows nothing of it either.
    let out = Command::new(procs::binary("escher"))
        .args(["objects", "--json"])
        .env("ESCHER_HEAD", cluster.head_url())
        .env("ESCHER_HOME", cluster.dir().join("escher-home"))
        .env_remove("ESCHER_TOKEN")
        .env_remove("ESCHER_ACCESS_FILE")
        .output()
        .expect("the escher CLI runs");
    assert!(out.status.success(), "{out:?}");
    let rows: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(rows, serde_json::json!([]), "{rows}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_live_idle_clients_objects_stay_past_the_lapse_and_go_at_once_when_it_closes() {
    let (_cluster, client, store) = start(1).await;
    let before = bytes_under(store.path());
    let kept = [
        client.put(vec![1u8; 32 << 10]).await.unwrap(),
        client.put(vec![2u8; 32 << 10]).await.unwrap(),
    ];
    tokio::time::sleep(LAPSE * 3).await;
    assert_eq!(kept[1].get().await.unwrap().len(), 32 << 10, "still there");
    assert_eq!(listed(&client).await.len(), 2);

    let closed = client.close_object_session().await.unwrap();
    assert_eq!(closed.session, kept[0].id().owner());
    assert_eq!(closed.released, vec![kept[0].id(), kept[1].id()]);
    assert!(closed.pinned.is_empty());
    // At once: the reply came after the commit.
    assert!(listed(&client).await.is_empty());
    let err = kept[0].get().await.unwrap_err();
    assert!(matches!(err, ClientError::NotFound(_)), "{err:?}");
    assert!(err.to_string().contains("freed"), "{err}");
    eventually("the store's bytes to return", WAIT, || async {
        (bytes_under(store.path()) <= before).then_some(())
    })
    .await;

    // Closing again has nothing to close; the next put opens a new session.
    assert_eq!(client.close_object_session().await.unwrap().session, 0);
    let next = client.put(vec![3u8; 10]).await.unwrap();
    assert_ne!(next.id().owner(), closed.session);
    assert_eq!(listed(&client).await, vec![next.id().to_string()]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tasks_put_into_its_callers_session_outlives_it_and_goes_with_its_adopters_last_ref() {
    let (_cluster, caller, store) = start(1).await;
    let before = bytes_under(store.path());
    let session = caller.open_object_session().await.unwrap();
    // A client speaking for a task of the caller's (as a Python task's does): its puts go
    // into the caller's session at the task's own indexes; it gives one up (to return it)
    // and drops the other, then goes away.
    let (kept, dropped) = {
        let task = caller.clone().within_object_session(session, TaskId(7), 1);
        let made = task.put(vec![9u8; 64 << 10]).await.unwrap();
        let scratch = task.put(vec![8u8; 64 << 10]).await.unwrap();
        assert_eq!(made.id().owner(), session);
        assert_eq!(made.id().index(), 1 << 63 | 7 << 26 | 1 << 20);
        assert_eq!(scratch.id().index(), made.id().index() + 1);
        made.disown();
        (made.id(), scratch.id())
    };
    // The dropped one is released by the task's client; the one given up is not.
    eventually("the task's scratch object to be released", WAIT, || async {
        (!listed(&caller).await.contains(&dropped.to_string())).then_some(())
    })
    .await;
    assert!(listed(&caller).await.contains(&kept.to_string()));
    // The caller adopts it: it reads it, and its last ref dropped releases it.
    let adopted = caller.adopt_object(kept);
    let copy = adopted.clone();
    drop(adopted);
    assert_eq!(copy.get().await.unwrap(), vec![9u8; 64 << 10]);
    drop(copy);
    released(&caller, &[kept.to_string()], store.path(), before).await;
    // The caller's own puts count from 0, apart from the task's range.
    let own = caller.put(vec![1u8; 10]).await.unwrap();
    assert_eq!(own.id(), ObjectId(session, 0));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_leader_change_keeps_a_live_sessions_objects_and_the_new_leader_releases_a_dead_ones() {
    let (mut cluster, admin, store) = start(3).await;
    let before = bytes_under(store.path());
    let mut owner = Owner::start(&cluster, 2, 16 << 10);
    let leader = cluster.wait_leader().await;
    cluster.kill_head_at(leader);
    eventually("another replica to lead", WAIT, || async {
        cluster.leader().await.filter(|l| *l != leader)
    })
    .await;
    // Through the failover and past a full lapse after it, the live client's objects stay.
    tokio::time::sleep(LAPSE * 3).await;
    assert_eq!(listed(&admin).await, owner.ids, "a live session survives");

    owner.kill();
    released(&admin, &owner.ids, store.path(), before).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_results_of_a_killed_clients_tasks_leave_the_store_once_its_session_lapses() {
    let (cluster, admin, store) = start_with(1, Some(procs::example("test_actor_worker"))).await;
    // A task of a client that never put (the admin's here, as an `escher submit`'s): its result
    // is no session's, and stays.
    let len: u64 = 256 << 10;
    let kept = admin
        .run(Task::function_typed("bytes", &(len, 9u8)), Some(WAIT))
        .await
        .expect("the admin's task");
    assert_eq!(kept.state, TaskState::Succeeded, "{kept:?}");
    assert!(matches!(kept.result, Some(TaskResult::Object { size, .. }) if size == len));
    let kept_id = ObjectId::task_result(kept.id).to_string();
    let before = bytes_under(store.path());

    // One put opens the client's session; its three tasks' results are objects of 256 KiB.
    let args = ["1", "1024", "3", &len.to_string()].map(String::from);
    let mut owner = Owner::start_args(&cluster, &args);
    assert_eq!(owner.ids.len(), 4, "{:?}", owner.ids);
    let mut all = owner.ids.clone();
    all.push(kept_id.clone());
    all.sort();
    assert_eq!(listed(&admin).await, all);
    assert!(bytes_under(store.path()) >= before + 3 * len);
    // Each result is its task's object, the task labelled with the client's session.
    let session = owner
        .ids
        .iter()
        .map(|id| id.parse::<ObjectId>().unwrap())
        .find(|id| id.owner() >= 1 << 63)
        .expect("the put")
        .owner();
    for id in owner.ids.iter().map(|id| id.parse::<ObjectId>().unwrap()) {
        if id.owner() == session {
            continue;
        }
        let task = TaskId(id.owner());
        let view = admin.locate_object(id).await.unwrap();
        assert_eq!(view.owner, ObjectOwner::Task(task));
        let info = admin.task_info(task).await.unwrap();
        let label = info
            .spec
            .labels
            .get(OBJECT_SESSION_LABEL)
            .map(str::to_owned);
        assert_eq!(label, Some(session.to_string()));
    }

    owner.kill();
    released(&admin, &owner.ids, store.path(), before).await;
    // The session-less result is still there, whole.
    assert_eq!(listed(&admin).await, vec![kept_id]);
    let bytes = admin.get_bytes(kept.id, Some(WAIT)).await.unwrap();
    assert_eq!(bytes, vec![9u8; len as usize]);
}

/// A client that opened its session before its first task and never put (a Python driver
/// does at `escher.init`) owns its tasks' results all the same: killed, it leaves none.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_session_opened_before_any_put_owns_the_results_of_a_killed_clients_tasks() {
    let (cluster, admin, store) = start_with(1, Some(procs::example("test_actor_worker"))).await;
    let before = bytes_under(store.path());
    let len: u64 = 256 << 10;
    let args = ["0", "0", "2", &len.to_string()].map(String::from);
    let mut owner = Owner::start_args(&cluster, &args);
    assert_eq!(owner.ids.len(), 2, "{:?}", owner.ids);
    assert_eq!(listed(&admin).await, owner.ids);
    assert!(bytes_under(store.path()) >= before + 2 * len);
    let mut sessions = Vec::new();
    for id in owner.ids.iter().map(|id| id.parse::<ObjectId>().unwrap()) {
        let info = admin.task_info(TaskId(id.owner())).await.unwrap();
        sessions.push(
            info.spec
                .labels
                .get(OBJECT_SESSION_LABEL)
                .map(str::to_owned),
        );
    }
    assert!(sessions[0].is_some(), "{sessions:?}");
    assert_eq!(sessions[0], sessions[1]);

    owner.kill();
    released(&admin, &owner.ids, store.path(), before).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_opened_session_is_refused_a_number_and_a_reader_may_not_open_one() {
    let (cluster, admin, _store) = start(1).await;
    // The number is the head's to give: a client names 0.
    let mut rpc =
        escher_proto::wire::cluster_client::ClusterClient::connect(cluster.head_url().to_string())
            .await
            .unwrap();
    let mut request = tonic::Request::new(escher_proto::wire::ObjectSessionRequest {
        session: 7,
        namespace: String::new(),
    });
    let access = escher_proto::access::AccessFile::read(&cluster.access_file()).unwrap();
    let bearer = format!("Bearer {}", access.admin_token);
    request
        .metadata_mut()
        .insert("authorization", bearer.parse().unwrap());
    let refused = rpc.open_object_session(request).await.unwrap_err();
    assert_eq!(refused.code(), tonic::Code::InvalidArgument, "{refused:?}");
    assert!(refused.message().contains("opened with 0"), "{refused:?}");
    // Two opens by one client give one session; the next client gets another.
    let first = admin.open_object_session().await.unwrap();
    assert_eq!(admin.open_object_session().await.unwrap(), first);
    let other = cluster.client().await.open_object_session().await.unwrap();
    assert_ne!(other, first);
    // A reader may not: it submits and puts nothing.
    let grant = escher::types::Grant::new(escher::types::Role::Reader, None).unwrap();
    let token = admin.create_token(grant, "reader").await.unwrap().token;
    let reader = admin.clone().with_token(token);
    let err = reader.open_object_session().await.unwrap_err();
    assert!(matches!(err, ClientError::PermissionDenied(_)), "{err:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_result_made_after_its_killed_clients_session_lapsed_is_released_too() {
    let (cluster, admin, store) = start_with(1, Some(procs::example("test_actor_worker"))).await;
    let before = bytes_under(store.path());
    let gate = cluster.dir().join("result-gate");
    let len: u64 = 256 << 10;
    let args = [
        "1".to_string(),
        "1024".to_string(),
        "1".to_string(),
        len.to_string(),
        gate.display().to_string(),
    ];
    let mut owner = Owner::start_args(&cluster, &args);
    // Sorted: the task's result id (a task id) before the put's (a session's).
    let [result, put] = &owner.ids[..] else {
        panic!("{:?}", owner.ids)
    };
    let (result, put) = (result.clone(), put.clone());
    let task = TaskId(result.parse::<ObjectId>().unwrap().owner());
    eventually("the client's task to run", WAIT, || async {
        let info = admin.task_info(task).await.ok()?;
        (info.status.state == TaskState::Running).then_some(())
    })
    .await;

    // Killed: its session lapses and its put goes, while its task still runs.
    owner.kill();
    eventually("the put to leave the table", WAIT, || async {
        (!listed(&admin).await.contains(&put)).then_some(())
    })
    .await;
    let info = admin.task_info(task).await.unwrap();
    assert_eq!(info.status.state, TaskState::Running, "{info:?}");

    // The result is made after the session ended: recorded with the task's success, then
    // released, not kept.
    std::fs::write(&gate, b"open").unwrap();
    let status = admin.get(task, Some(WAIT)).await.unwrap();
    assert_eq!(status.state, TaskState::Succeeded, "{status:?}");
    assert!(matches!(status.result, Some(TaskResult::Object { size, .. }) if size == len));
    released(&admin, &[result, put], store.path(), before).await;
}
