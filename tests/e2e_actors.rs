//! End to end: Rust actors on a real [`LocalCluster`] (a real head and real workers talking
//! gRPC on loopback; calls go from the client to the hosting worker's data plane).
//!
//! Topics, in order: state and the order of calls, resources held from start to exit, names,
//! restarts (the constructor re-run, calls in flight failed or retried), bad input,
//! namespaces and roles, what an operator sees (`escher actors`, actor watch events), and the
//! leader of a three-replica head stopped under an actor workload.
//!
//! [`LocalCluster`]: escher::LocalCluster

mod common;

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use common::{cluster, eventually, resource, status, within};
use escher::types::{
    ACTOR_LABEL, ActorChange, ClusterEvent, Grant, ListTasksRequest, LogStream, NodeId, Role,
    TaskId, TaskState, WatchEvent, WatchKind, WatchRequest,
};
use escher::{ActorClass, CallCanceller, Client, ClientError, LocalCluster, Task};

/// A counter: `Counter(start)`; `add(n)` returns the new count, `get()` the count, `slow(ms)`
/// sleeps then returns the count, `panic()` panics, `fail(why)` returns an error.
fn counter() -> ActorClass {
    struct Counter {
        n: u64,
    }
    ActorClass::new("Counter", |_ctx, start: u64| async move {
        Ok(Counter { n: start })
    })
    .method("add", |c: &mut Counter, by: u64| {
        c.n += by;
        Ok(c.n)
    })
    .method("get", |c: &mut Counter, (): ()| Ok(c.n))
    .method("slow", |c: &mut Counter, ms: u64| {
        std::thread::sleep(Duration::from_millis(ms));
        Ok(c.n)
    })
    .method("panic", |_c: &mut Counter, (): ()| -> Result<(), String> {
        panic!("asked to panic")
    })
    .method(
        "fail",
        |_c: &mut Counter, why: String| -> Result<(), String> { Err(why) },
    )
}

/// Set when `Gate.block` has started; `Gate.block` returns once `GATE_OPEN` is set (the
/// workers of a `LocalCluster` run in this process).
static GATE_STARTED: AtomicBool = AtomicBool::new(false);
static GATE_OPEN: AtomicBool = AtomicBool::new(false);

/// `Gate()`: `block()` runs until the test opens the gate; `add(n)` notes `n` and returns
/// every number noted, in order.
fn gate() -> ActorClass {
    ActorClass::new("Gate", |_ctx, (): ()| async move { Ok(Vec::<u64>::new()) })
        .method("block", |_seen: &mut Vec<u64>, (): ()| {
            GATE_STARTED.store(true, Ordering::SeqCst);
            while !GATE_OPEN.load(Ordering::SeqCst) {
                std::thread::sleep(Duration::from_millis(5));
            }
            Ok(Vec::<u64>::new())
        })
        .method("add", |seen: &mut Vec<u64>, n: u64| {
            seen.push(n);
            Ok(seen.clone())
        })
}

/// A class whose constructor fails when its argument is empty.
fn picky() -> ActorClass {
    ActorClass::new("Picky", |_ctx, word: String| async move {
        if word.is_empty() {
            Err("the word is empty".to_string())
        } else {
            Ok(word)
        }
    })
    .method("word", |w: &mut String, (): ()| Ok(w.clone()))
}

/// When the latest `Slow` constructor returned (milliseconds since the Unix epoch).
static SLOW_MADE_AT_MS: AtomicU64 = AtomicU64::new(0);

fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

/// A class whose constructor takes `ms` milliseconds, and notes when it returned.
fn slow() -> ActorClass {
    ActorClass::new("Slow", |_ctx, ms: u64| async move {
        tokio::time::sleep(Duration::from_millis(ms)).await;
        SLOW_MADE_AT_MS.store(now_ms(), Ordering::SeqCst);
        Ok(ms)
    })
    .method("get", |ms: &mut u64, (): ()| Ok(*ms))
}

/// A class that writes to its task's output: `Talker(greeting)` prints the greeting to stdout
/// and its incarnation to stderr; `say(line)` prints the line.
fn talker() -> ActorClass {
    use std::io::Write as _;
    struct Talker {
        out: escher::worker::TaskOutput,
    }
    ActorClass::new("Talker", |ctx, greeting: String| async move {
        let mut out = ctx.stdout();
        writeln!(out, "{greeting}").map_err(|e| e.to_string())?;
        writeln!(ctx.stderr(), "incarnation {}", ctx.attempt()).map_err(|e| e.to_string())?;
        Ok(Talker { out })
    })
    .method("say", |t: &mut Talker, line: String| {
        writeln!(t.out, "{line}").map_err(|e| e.to_string())
    })
}

async fn start(workers: usize) -> (LocalCluster, Client) {
    let cluster = within(
        "starting the cluster",
        cluster()
            .functions(
                common::functions()
                    .actor(counter())
                    .actor(picky())
                    .actor(slow())
                    .actor(talker())
                    .actor(gate()),
            )
            .workers(workers)
            .start(),
    )
    .await
    .expect("the local cluster starts");
    let client = within("connecting", cluster.client())
        .await
        .expect("connects");
    (cluster, client)
}

fn cpu_available(status: &escher::types::ClusterStatus, node: NodeId) -> String {
    resource(status, node, "cpu")
        .expect("every node has cpu")
        .available()
        .map_or_else(|| "unbounded".to_string(), |a| a.to_string())
}

// ---- state and order ------------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_actor_keeps_its_state_and_starts_one_callers_calls_in_order() {
    let (_cluster, client) = start(1).await;
    let counter = within("create", client.actor(Task::actor_typed("Counter", &10u64)))
        .await
        .unwrap();
    let first: u64 = within("first call", counter.call("add", &1u64))
        .await
        .unwrap();
    assert_eq!(first, 11);

    // 200 calls in flight at once from one handle: each sees every earlier one.
    let calls = (0..200).map(|_| counter.call::<u64, u64>("add", &1));
    let results = within("pipelined calls", futures_util::future::join_all(calls)).await;
    let results: Vec<u64> = results.into_iter().map(Result::unwrap).collect();
    assert_eq!(results, (12..212).collect::<Vec<u64>>());
    let n: u64 = within("get", counter.call("get", &())).await.unwrap();
    assert_eq!(n, 211);

    // A second handle (found by id) reaches the same instance.
    let again = client.actor_by_id(counter.id());
    let n: u64 = within("get through another handle", again.call("get", &()))
        .await
        .unwrap();
    assert_eq!(n, 211);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cancelled_queued_call_is_removed_while_a_running_one_runs_on_and_the_rest_keep_order() {
    let (_cluster, client) = start(1).await;
    let gate = within("create", client.actor(Task::actor_typed("Gate", &())))
        .await
        .unwrap();
    let _: Vec<u64> = within("a first call", gate.call("add", &0u64))
        .await
        .unwrap();
    let (running, queued) = (CallCanceller::new(), CallCanceller::new());
    // Four calls made in this order (first polled in order by one join), each answer sent back
    // as it comes: block (runs), add 1, add 10 (to be cancelled), add 2.
    let calls: Vec<(&str, u64, Option<CallCanceller>)> = vec![
        ("block", 0, Some(running.clone())),
        ("add", 1, None),
        ("add", 10, Some(queued.clone())),
        ("add", 2, None),
    ];
    let mut answers = Vec::new();
    let mut made = Vec::new();
    for (method, n, cancel) in calls {
        let (tx, rx) = tokio::sync::oneshot::channel();
        answers.push(rx);
        let gate = gate.clone();
        made.push(async move {
            let answer: Result<Vec<u64>, ClientError> = match (method, cancel) {
                ("block", Some(c)) => gate.call_with("block", &(), &c).await,
                (_, Some(c)) => gate.call_with(method, &n, &c).await,
                (_, None) => gate.call(method, &n).await,
            };
            let _ = tx.send(answer);
        });
    }
    tokio::spawn(futures_util::future::join_all(made));
    let mut answers = answers.into_iter();
    let (block, first, cancelled, later) = (
        answers.next().unwrap(),
        answers.next().unwrap(),
        answers.next().unwrap(),
        answers.next().unwrap(),
    );
    eventually("block to start", || async {
        GATE_STARTED.load(Ordering::SeqCst).then_some(())
    })
    .await;
    // A Rust method is not interrupted: the running call's cancel changes nothing. The queued
    // one is removed and answered at once, while the gate is still closed.
    running.cancel();
    queued.cancel();
    let answer = within("the cancelled call's answer", cancelled)
        .await
        .unwrap();
    assert!(
        matches!(&answer, Err(ClientError::ActorCallCancelled { method, reason, .. })
            if method == "add" && reason.contains("cancelled before it started")),
        "{answer:?}"
    );
    GATE_OPEN.store(true, Ordering::SeqCst);
    let block = within("block's answer", block).await.unwrap();
    assert_eq!(block.unwrap(), Vec::<u64>::new());
    assert_eq!(within("add 1", first).await.unwrap().unwrap(), vec![0, 1]);
    assert_eq!(
        within("add 2", later).await.unwrap().unwrap(),
        vec![0, 1, 2]
    );
    // Cancelling an answered call changes nothing; the actor goes on.
    queued.cancel();
    let after: Vec<u64> = within("a call after", gate.call("add", &3u64))
        .await
        .unwrap();
    assert_eq!(after, vec![0, 1, 2, 3]);
    // A call cancelled before it is made is never sent.
    let never = CallCanceller::new();
    never.cancel();
    let answer = within(
        "a call cancelled first",
        gate.call_with::<u64, Vec<u64>>("add", &4, &never),
    )
    .await;
    assert!(
        matches!(answer, Err(ClientError::ActorCallCancelled { .. })),
        "{answer:?}"
    );
    let after: Vec<u64> = within("a call after", gate.call("add", &5u64))
        .await
        .unwrap();
    assert_eq!(after, vec![0, 1, 2, 3, 5]);
}

// ---- resources ------------------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_actor_holds_its_resources_from_start_to_exit() {
    let (cluster, client) = start(1).await;
    let node = cluster.nodes()[0];
    assert_eq!(cpu_available(&status(&client).await, node), "4");
    let counter = within(
        "create",
        client.actor(Task::actor_typed("Counter", &0u64).resources_str("cpu=3")),
    )
    .await
    .unwrap();
    let _: u64 = within("a call", counter.call("get", &())).await.unwrap();
    assert_eq!(cpu_available(&status(&client).await, node), "1");

    // A task asking for two CPUs waits while the actor lives, and runs once it is killed.
    let waiting = client
        .submit(Task::function_typed("noop", &()).resources_str("cpu=2"))
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_millis(300)).await;
    let info = client.task_info(waiting.id()).await.unwrap();
    assert_eq!(info.status.state, TaskState::Pending, "{info:?}");

    let state = within("kill", counter.kill(true)).await.unwrap();
    assert_eq!(state, TaskState::Cancelled);
    let done = within("the waiting task", client.get(waiting.id(), None))
        .await
        .unwrap();
    assert_eq!(done.state, TaskState::Succeeded, "{done:?}");
    eventually("the actor's CPUs back", || async {
        (cpu_available(&status(&client).await, node) == "4").then_some(())
    })
    .await;
    let err = within(
        "a call to a killed actor",
        counter.call::<(), u64>("get", &()),
    )
    .await
    .unwrap_err();
    assert!(
        matches!(&err, ClientError::ActorDied { reason, .. } if reason.contains("killed") || reason.contains("cancel")),
        "{err}"
    );
}

/// An actor's `on_start` hook creates its resource on the actor's node when the actor starts,
/// as a task's does: a task that needs that resource is placed there.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_actors_start_hook_creates_its_resource_on_the_actors_node_as_a_tasks_does() {
    use escher::client::ResourceUpdateExt as _;
    use escher::types::{NodeSpec, ResourceUpdate};

    let (cluster, client) = start(2).await;
    let ps = within(
        "create",
        client.actor(
            Task::actor_typed("Counter", &0u64)
                .on_start(ResourceUpdate::set("ps-up", 1, NodeSpec::Local).unwrap()),
        ),
    )
    .await
    .unwrap();
    let _: u64 = within("a call", ps.call("get", &())).await.unwrap();
    let node = ps
        .describe()
        .await
        .unwrap()
        .node
        .expect("a running actor has a node");
    eventually("the actor's resource on its node", || {
        let client = client.clone();
        async move {
            let status = client.cluster_status().await.ok()?;
            resource(&status, node, "ps-up")?;
            Some(())
        }
    })
    .await;
    for other in cluster.nodes().into_iter().filter(|n| *n != node) {
        assert!(resource(&status(&client).await, other, "ps-up").is_none());
    }
    let follower = client
        .submit(Task::function_typed("where", &()).resource("ps-up", 1))
        .await
        .unwrap();
    let ran: u64 = within("the follower", client.get_typed(&follower, None))
        .await
        .unwrap();
    assert_eq!(NodeId(ran), node);
    within("kill", ps.kill(true)).await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dropping_the_last_handle_of_an_owned_actor_ends_it_but_not_a_detached_one() {
    let (cluster, client) = start(1).await;
    let node = cluster.nodes()[0];
    let owned = within(
        "create",
        client.actor(Task::actor_typed("Counter", &0u64).resources_str("cpu=1")),
    )
    .await
    .unwrap();
    let detached = within(
        "create detached",
        client.actor(
            Task::actor_typed("Counter", &0u64)
                .resources_str("cpu=1")
                .detached(),
        ),
    )
    .await
    .unwrap();
    let (owned_id, detached_id) = (owned.id(), detached.id());
    let _: u64 = within("call", owned.call("get", &())).await.unwrap();
    let _: u64 = within("call", detached.call("get", &())).await.unwrap();
    assert_eq!(cpu_available(&status(&client).await, node), "2");
    let clone = owned.clone();
    drop(owned);
    let _: u64 = within("a clone still calls", clone.call("get", &()))
        .await
        .unwrap();
    drop(clone);
    drop(detached);
    let ended = within("the owned actor ends", client.get(owned_id, None))
        .await
        .unwrap();
    assert_eq!(ended.state, TaskState::Cancelled);
    let info = client.task_info(detached_id).await.unwrap();
    assert_eq!(info.status.state, TaskState::Running, "{info:?}");
    assert_eq!(cpu_available(&status(&client).await, node), "3");
}

// ---- names ----------------------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_named_actor_is_found_by_another_client_and_its_name_is_unique_while_it_lives() {
    let (cluster, client) = start(1).await;
    let ps = within(
        "create",
        client.actor(Task::actor_typed("Counter", &7u64).actor_name("ps")),
    )
    .await
    .unwrap();
    let other = within("a second client", cluster.client()).await.unwrap();
    let found = within("actor_named", other.actor_named("ps"))
        .await
        .unwrap();
    assert_eq!(found.id(), ps.id());
    let n: u64 = within("call", found.call("add", &1u64)).await.unwrap();
    assert_eq!(n, 8);

    let taken = within(
        "the same name again",
        client.actor(Task::actor_typed("Counter", &0u64).actor_name("ps")),
    )
    .await
    .unwrap_err();
    let text = taken.to_string();
    assert!(
        text.contains("\"ps\"") && text.contains(&ps.id().to_string()),
        "{text}"
    );
    let unknown = within("an unknown name", other.actor_named("nobody"))
        .await
        .unwrap_err();
    assert!(matches!(unknown, ClientError::NotFound(_)), "{unknown}");

    within("kill", ps.kill(true)).await.unwrap();
    let again = within(
        "the name is free again",
        client.actor(Task::actor_typed("Counter", &1u64).actor_name("ps")),
    )
    .await
    .unwrap();
    let n: u64 = within("call", again.call("get", &())).await.unwrap();
    assert_eq!(n, 1);
}

// ---- restarts -------------------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_panicking_method_restarts_the_actor_with_its_constructor_run_again() {
    let (_cluster, client) = start(1).await;
    let counter = within(
        "create",
        client.actor(Task::actor_typed("Counter", &10u64).max_restarts(1)),
    )
    .await
    .unwrap();
    let n: u64 = within("add", counter.call("add", &5u64)).await.unwrap();
    assert_eq!(n, 15);
    let died = within("panic", counter.call::<(), ()>("panic", &()))
        .await
        .unwrap_err();
    assert!(
        matches!(&died, ClientError::ActorDied { reason, .. } if reason.contains("panicked") && reason.contains("asked to panic")),
        "{died}"
    );
    // The next call waits for the restart and meets a fresh instance: its state was lost.
    let n: u64 = within("after the restart", counter.call("get", &()))
        .await
        .unwrap();
    assert_eq!(n, 10);
    let view = counter.describe().await.unwrap();
    assert_eq!(view.incarnation, 2, "{view:?}");

    // Out of restarts: the actor fails for good, and calls say why.
    let _ = within("panic again", counter.call::<(), ()>("panic", &())).await;
    let gone = within(
        "a call after the last restart",
        counter.call::<(), u64>("get", &()),
    )
    .await
    .unwrap_err();
    assert!(
        matches!(&gone, ClientError::ActorDied { reason, .. } if reason.contains("panicked")),
        "{gone}"
    );
    let ended = within("the actor's task", client.get(counter.id(), None))
        .await
        .unwrap();
    assert_eq!(ended.state, TaskState::Failed, "{ended:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_call_in_flight_fails_with_the_reason_or_goes_to_the_next_incarnation_when_allowed() {
    let (_cluster, client) = start(1).await;
    // Without retries: the call in flight when the incarnation is stopped fails, naming why.
    let plain = within(
        "create",
        client.actor(Task::actor_typed("Counter", &1u64).max_restarts(1)),
    )
    .await
    .unwrap();
    let _: u64 = within("warm", plain.call("get", &())).await.unwrap();
    let slow = {
        let plain = plain.clone();
        tokio::spawn(async move { plain.call::<u64, u64>("slow", &1_000).await })
    };
    tokio::time::sleep(Duration::from_millis(200)).await;
    within("restart", plain.kill(false)).await.unwrap();
    let err = within("the slow call", slow).await.unwrap().unwrap_err();
    assert!(
        matches!(&err, ClientError::ActorDied { reason, .. } if reason.contains("killed")),
        "{err}"
    );

    // With max_task_retries: it is sent again to the next incarnation and answered there.
    let retried = within(
        "create",
        client.actor(
            Task::actor_typed("Counter", &2u64)
                .max_restarts(1)
                .max_task_retries(1),
        ),
    )
    .await
    .unwrap();
    let _: u64 = within("warm", retried.call("get", &())).await.unwrap();
    let slow = {
        let retried = retried.clone();
        tokio::spawn(async move { retried.call::<u64, u64>("slow", &1_000).await })
    };
    tokio::time::sleep(Duration::from_millis(200)).await;
    within("restart", retried.kill(false)).await.unwrap();
    let n = within("the retried call", slow).await.unwrap().unwrap();
    assert_eq!(n, 2);
    assert_eq!(retried.describe().await.unwrap().incarnation, 2);
}

// ---- bad input ------------------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_calls_and_bad_actors_get_clear_errors_and_leave_nothing_behind() {
    let (cluster, client) = start(1).await;
    let node = cluster.nodes()[0];
    let counter = within("create", client.actor(Task::actor_typed("Counter", &3u64)))
        .await
        .unwrap();
    // A method that does not exist, and one that fails: the actor lives on.
    let err = within("no such method", counter.call::<(), ()>("nope", &()))
        .await
        .unwrap_err();
    assert!(
        matches!(&err, ClientError::ActorCall { message, .. } if message.contains("no method \"nope\"") && message.contains("add, fail, get, panic, slow")),
        "{err}"
    );
    let err = within(
        "a failing method",
        counter.call::<String, ()>("fail", &"bad day".into()),
    )
    .await
    .unwrap_err();
    assert!(
        matches!(&err, ClientError::ActorCall { message, .. } if message == "bad day"),
        "{err}"
    );
    let err = within(
        "bad arguments",
        counter.call::<String, u64>("add", &"x".into()),
    )
    .await
    .unwrap_err();
    assert!(
        err.to_string().contains("cannot decode its arguments"),
        "{err}"
    );
    let n: u64 = within("still alive", counter.call("get", &()))
        .await
        .unwrap();
    assert_eq!(n, 3);
    within("kill", counter.kill(true)).await.unwrap();

    // A class no worker registered: the actor's task fails, and a call says why.
    let ghost = within(
        "unknown class",
        client.actor(Task::actor_typed("Nobody", &())),
    )
    .await
    .unwrap();
    let err = within("call it", ghost.call::<(), ()>("x", &()))
        .await
        .unwrap_err();
    assert!(
        matches!(&err, ClientError::ActorDied { reason, .. } if reason.contains("no actor class \"Nobody\"")),
        "{err}"
    );
    // A constructor that fails.
    let picky = within(
        "bad constructor",
        client.actor(Task::actor_typed("Picky", &"")),
    )
    .await
    .unwrap();
    let err = within("call it", picky.call::<(), String>("word", &()))
        .await
        .unwrap_err();
    assert!(
        matches!(&err, ClientError::ActorDied { reason, .. } if reason.contains("the word is empty")),
        "{err}"
    );
    // A Rust class runs one call at a time.
    let wide = within(
        "max_concurrency 2",
        client.actor(Task::actor_typed("Counter", &0u64).max_concurrency(2)),
    )
    .await
    .unwrap();
    let err = within("call it", wide.call::<(), u64>("get", &()))
        .await
        .unwrap_err();
    assert!(
        err.to_string().contains("max_concurrency must be 1"),
        "{err}"
    );
    // Refused before anything is sent.
    let err = client
        .actor(Task::actor_typed("Counter", &0u64).max_concurrency(0))
        .await
        .unwrap_err();
    assert!(
        matches!(&err, ClientError::Usage(m) if m.contains("max_concurrency")),
        "{err}"
    );
    let err = client
        .actor(Task::function_typed("noop", &()))
        .await
        .unwrap_err();
    assert!(matches!(err, ClientError::Usage(_)), "{err}");
    let err = client
        .submit(Task::function_typed("noop", &()).max_restarts(1))
        .await
        .unwrap_err();
    assert!(
        err.to_string()
            .contains("max_restarts applies only to actors"),
        "{err}"
    );
    // An actor no node can hold is created, and waits with the reason a task gets; a call to
    // it waits for it; killed, it held nothing.
    let huge = within(
        "an actor no node can hold",
        client.actor(Task::actor_typed("Counter", &0u64).resources_str("cpu=64")),
    )
    .await
    .unwrap();
    let reason = eventually("its pending reason", || {
        let (client, id) = (client.clone(), huge.id());
        async move { client.task_info(id).await.ok()?.pending_reason }
    })
    .await;
    assert_eq!(reason.resource.to_string(), "cpu", "{reason}");
    assert!(
        reason.message.contains("cpu") && reason.message.contains("64"),
        "{reason}"
    );
    let view = huge.describe().await.unwrap();
    assert_eq!(view.state, TaskState::Pending, "{view:?}");
    assert!(
        tokio::time::timeout(Duration::from_millis(300), huge.call::<(), u64>("get", &()))
            .await
            .is_err(),
        "a call to an actor not yet placed waits"
    );
    within("kill it", huge.kill(true)).await.unwrap();

    // Nothing is held.
    eventually("every CPU free", || async {
        (cpu_available(&status(&client).await, node) == "4").then_some(())
    })
    .await;
}

// ---- namespaces and roles -------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn another_namespace_cannot_see_or_call_an_actor_and_a_reader_cannot_call() {
    let (_cluster, admin) = start(1).await;
    let token = |role, ns: Option<&str>| {
        let admin = admin.clone();
        let ns = ns.map(str::to_string);
        async move {
            let grant = Grant::new(role, ns.map(|n| n.parse().unwrap())).unwrap();
            admin.create_token(grant, "actors").await.unwrap().token
        }
    };
    let a = admin
        .clone()
        .with_token(token(Role::App, Some("team-a")).await);
    let b = admin
        .clone()
        .with_token(token(Role::App, Some("team-b")).await);
    let reader = admin.clone().with_token(token(Role::Reader, None).await);

    let ps = within(
        "create in team-a",
        a.actor(Task::actor_typed("Counter", &1u64).actor_name("ps")),
    )
    .await
    .unwrap();
    let n: u64 = within("team-a calls", ps.call("get", &())).await.unwrap();
    assert_eq!(n, 1);

    let err = within("team-b by name", b.actor_named("ps"))
        .await
        .unwrap_err();
    assert!(matches!(err, ClientError::NotFound(_)), "{err}");
    let err = within(
        "team-b by id",
        b.actor_by_id(ps.id()).call::<(), u64>("get", &()),
    )
    .await
    .unwrap_err();
    assert!(matches!(err, ClientError::NotFound(_)), "{err}");
    // The same name is free in another namespace.
    let theirs = within(
        "team-b's own ps",
        b.actor(Task::actor_typed("Counter", &2u64).actor_name("ps")),
    )
    .await
    .unwrap();
    let n: u64 = within("team-b calls", theirs.call("get", &()))
        .await
        .unwrap();
    assert_eq!(n, 2);

    let err = within(
        "a reader calls",
        reader.actor_by_id(ps.id()).call::<(), u64>("get", &()),
    )
    .await
    .unwrap_err();
    assert!(matches!(err, ClientError::PermissionDenied(_)), "{err}");
}

// ---- actors that answer calls themselves ----------------------------------------------------

/// A dynamic class (as a Python actor's host is): `hold(n, ms)` notes that call `n` started,
/// sleeps `ms`, and answers how many calls were running when it started and the order in which
/// calls started so far.
fn juggler() -> ActorClass {
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::{Arc, Mutex};

    struct Juggler {
        running: Arc<AtomicUsize>,
        started: Mutex<Vec<u64>>,
        stop: tokio_util::sync::CancellationToken,
    }
    impl escher::worker::DynamicActor for Juggler {
        fn call(
            &self,
            method: String,
            args: bytes::Bytes,
        ) -> escher::worker::BoxFuture<Result<Vec<u8>, String>> {
            if method != "hold" {
                return Box::pin(async move { Err(format!("no method {method}")) });
            }
            let (n, ms): (u64, u64) = match escher::codec::decode(&args) {
                Ok(v) => v,
                Err(e) => return Box::pin(async move { Err(e.to_string()) }),
            };
            let now = self.running.fetch_add(1, Ordering::SeqCst) + 1;
            let started = {
                let mut started = self.started.lock().unwrap();
                started.push(n);
                started.clone()
            };
            let running = Arc::clone(&self.running);
            Box::pin(async move {
                tokio::time::sleep(Duration::from_millis(ms)).await;
                running.fetch_sub(1, Ordering::SeqCst);
                escher::codec::encode(&(now as u64, started)).map_err(|e| e.to_string())
            })
        }
        fn ended(&self) -> escher::worker::BoxFuture<String> {
            let stop = self.stop.clone();
            Box::pin(async move {
                stop.cancelled().await;
                "it stopped".to_string()
            })
        }
        fn stop(&self) -> escher::worker::BoxFuture<()> {
            self.stop.cancel();
            Box::pin(async {})
        }
    }
    ActorClass::dynamic("Juggler", |_ctx, _args, _max| {
        Box::pin(async move {
            let juggler: Arc<dyn escher::worker::DynamicActor> = Arc::new(Juggler {
                running: Arc::new(AtomicUsize::new(0)),
                started: Mutex::new(Vec::new()),
                stop: tokio_util::sync::CancellationToken::new(),
            });
            Ok(juggler)
        })
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_actor_that_answers_calls_itself_runs_at_most_max_concurrency_of_them_started_in_order()
{
    let cluster = within(
        "starting the cluster",
        cluster()
            .functions(common::functions().actor(juggler()))
            .workers(1)
            .start(),
    )
    .await
    .expect("the local cluster starts");
    let client = within("connecting", cluster.client())
        .await
        .expect("connects");
    let juggler = within(
        "create",
        client.actor(Task::actor_typed("Juggler", &()).max_concurrency(3)),
    )
    .await
    .unwrap();
    let args: Vec<(u64, u64)> = (0..9u64).map(|n| (n, 300)).collect();
    let calls = args
        .iter()
        .map(|a| juggler.call::<(u64, u64), (u64, Vec<u64>)>("hold", a));
    let answers = within("nine calls", futures_util::future::join_all(calls)).await;
    let answers: Vec<(u64, Vec<u64>)> = answers.into_iter().map(Result::unwrap).collect();
    let most = answers.iter().map(|(running, _)| *running).max().unwrap();
    assert_eq!(most, 3, "{answers:?}");
    let (_, order) = answers.last().unwrap();
    assert_eq!(order, &(0..9).collect::<Vec<u64>>());

    // Stopped by a kill: a call in flight is answered with why.
    let held = {
        let juggler = juggler.clone();
        tokio::spawn(async move {
            juggler
                .call::<(u64, u64), (u64, Vec<u64>)>("hold", &(9, 5_000))
                .await
        })
    };
    tokio::time::sleep(Duration::from_millis(200)).await;
    within("kill", juggler.kill(true)).await.unwrap();
    let err = within("the held call", held).await.unwrap().unwrap_err();
    assert!(matches!(err, ClientError::ActorDied { .. }), "{err}");
}

// ---- what an operator sees ------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn escher_actors_lists_each_live_actor_with_its_class_node_and_restarts() {
    let (cluster, client) = start(1).await;
    let node = cluster.nodes()[0];
    let ps = within(
        "create",
        client.actor(
            Task::actor_typed("Counter", &1u64)
                .actor_name("ps")
                .max_restarts(2)
                .resources_str("cpu=1"),
        ),
    )
    .await
    .unwrap();
    let _: u64 = within("call", ps.call("get", &())).await.unwrap();
    within("restart", ps.kill(false)).await.unwrap();
    let _: u64 = within("call after the restart", ps.call("get", &()))
        .await
        .unwrap();
    let info = client.task_info(ps.id()).await.unwrap();
    assert_eq!(info.spec.labels.get("escher.actor"), Some("Counter"));

    let escher = common::escher_bin();
    let out = tokio::task::spawn_blocking({
        let (head, token) = (
            cluster.head_url().to_string(),
            cluster.admin_token().to_string(),
        );
        move || {
            std::process::Command::new(escher)
                .args(["actors", "--json"])
                .env("ESCHER_HEAD", head)
                .env("ESCHER_TOKEN", token)
                .env_remove("ESCHER_ACCESS_FILE")
                .env("ESCHER_HOME", "/nonexistent/escher-actors-test")
                .output()
                .expect("the escher CLI runs")
        }
    })
    .await
    .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let rows: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let rows = rows.as_array().unwrap();
    assert_eq!(rows.len(), 1, "{rows:?}");
    assert_eq!(rows[0]["id"], ps.id().0);
    assert_eq!(rows[0]["name"], "ps");
    assert_eq!(rows[0]["class"], "Counter");
    assert_eq!(rows[0]["state"], "running");
    assert_eq!(rows[0]["node"], node.0);
    assert_eq!(rows[0]["restarts"], 1);
    assert_eq!(rows[0]["resources"], "cpu=1");

    // `escher logs` of an actor reads each incarnation in turn, naming each; with --follow it
    // goes on until the actor has ended.
    let cli = |args: Vec<String>| {
        let (head, token) = (
            cluster.head_url().to_string(),
            cluster.admin_token().to_string(),
        );
        let escher = common::escher_bin();
        tokio::task::spawn_blocking(move || {
            std::process::Command::new(escher)
                .args(args)
                .env("ESCHER_HEAD", head)
                .env("ESCHER_TOKEN", token)
                .env_remove("ESCHER_ACCESS_FILE")
                .env("ESCHER_HOME", "/nonexistent/escher-actors-test")
                .output()
                .expect("the escher CLI runs")
        })
    };
    let id = ps.id().0.to_string();
    // `escher status` counts the live actors.
    let out = cli(vec!["status".into()]).await.unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        text.contains("1 actor: 1 running, 0 pending or restarting"),
        "{text}"
    );
    let out = cli(vec!["logs".into(), id.clone()]).await.unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{err}");
    let marks: Vec<&str> = err.lines().filter(|l| l.contains(" of actor ")).collect();
    assert_eq!(
        marks,
        [
            format!("escher: incarnation 1 of actor {id} on node {}", node.0),
            format!("escher: incarnation 2 of actor {id} on node {}", node.0)
        ],
        "{err}"
    );
    // A Rust actor runs inside its worker and keeps no output of its own: each incarnation
    // says so rather than fail the command.
    for k in [1, 2] {
        assert!(
            err.contains(&format!("escher: incarnation {k}: "))
                && err.contains(&format!("no stdout log for task {id} attempt {k}")),
            "{err}"
        );
    }
    within("kill", ps.kill(true)).await.unwrap();
    within("the actor ends", client.get(ps.id(), None))
        .await
        .unwrap();
    let out = within(
        "logs --follow of an ended actor returns",
        cli(vec!["logs".into(), "--follow".into(), id.clone()]),
    )
    .await
    .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{err}");
    assert_eq!(
        err.lines().filter(|l| l.contains(" of actor ")).count(),
        2,
        "{err}"
    );
}

/// What a Rust actor writes to its context's stdout and stderr is its task's output, per
/// incarnation, read while it runs and kept by the head once it ended, as a command's is.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rust_actors_output_is_its_tasks_logs() {
    let (_cluster, client) = start(1).await;
    let talker = within(
        "create",
        client.actor(Task::actor_typed("Talker", &"hello").max_restarts(1)),
    )
    .await
    .unwrap();
    let id = talker.id();
    within(
        "say",
        talker.call::<String, ()>("say", &"first line".into()),
    )
    .await
    .unwrap();
    within(
        "say",
        talker.call::<String, ()>("say", &"second line".into()),
    )
    .await
    .unwrap();
    let out = within("stdout", client.logs(id, LogStream::Stdout))
        .await
        .unwrap();
    assert_eq!(
        String::from_utf8_lossy(&out),
        "hello\nfirst line\nsecond line\n"
    );
    let err = within("stderr", client.logs(id, LogStream::Stderr))
        .await
        .unwrap();
    assert_eq!(String::from_utf8_lossy(&err), "incarnation 1\n");

    // A restart is a new attempt with logs of its own; the first incarnation's stay readable.
    within("restart", talker.kill(false)).await.unwrap();
    within(
        "say after the restart",
        talker.call::<String, ()>("say", &"again".into()),
    )
    .await
    .unwrap();
    let out = within(
        "stdout of incarnation 2",
        client.logs(id, LogStream::Stdout),
    )
    .await
    .unwrap();
    assert_eq!(String::from_utf8_lossy(&out), "hello\nagain\n");
    let first = within(
        "stdout of incarnation 1",
        client
            .log_reader(id, LogStream::Stdout)
            .attempt(1)
            .read_available(),
    )
    .await
    .unwrap();
    assert_eq!(
        String::from_utf8_lossy(&first),
        "hello\nfirst line\nsecond line\n"
    );
}

/// `escher logs --follow` of a live actor prints each incarnation's output as it is written,
/// goes on into the next incarnation across a restart (naming it), and returns once the
/// actor has been killed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn escher_logs_follow_goes_on_across_a_restart_until_the_actor_ends() {
    use std::io::BufRead as _;
    use std::process::Stdio;

    let (cluster, client) = start(1).await;
    let talker = within(
        "create",
        client.actor(Task::actor_typed("Talker", &"hello").max_restarts(1)),
    )
    .await
    .unwrap();
    within("say", talker.call::<String, ()>("say", &"before".into()))
        .await
        .unwrap();
    let mut follower = std::process::Command::new(common::escher_bin())
        .args(["logs", "--follow", &talker.id().0.to_string()])
        .env("ESCHER_HEAD", cluster.head_url())
        .env("ESCHER_TOKEN", cluster.admin_token())
        .env_remove("ESCHER_ACCESS_FILE")
        .env("ESCHER_HOME", "/nonexistent/escher-actors-test")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("the escher CLI runs");
    // Its stdout, line by line, as it comes.
    let (lines, mut seen) = tokio::sync::mpsc::unbounded_channel();
    let stdout = follower.stdout.take().unwrap();
    std::thread::spawn(move || {
        for line in std::io::BufReader::new(stdout).lines() {
            let Ok(line) = line else { break };
            if lines.send(line).is_err() {
                break;
            }
        }
    });
    async fn until(
        seen: &mut tokio::sync::mpsc::UnboundedReceiver<String>,
        want: &str,
        got: &mut Vec<String>,
    ) {
        while !got.iter().any(|l| l == want) {
            let line = within(&format!("the follower to print {want:?}"), seen.recv())
                .await
                .unwrap_or_else(|| panic!("the follower ended before {want:?}: {got:?}"));
            got.push(line);
        }
    }
    let mut got = Vec::new();
    until(&mut seen, "before", &mut got).await;
    within("say", talker.call::<String, ()>("say", &"live".into()))
        .await
        .unwrap();
    until(&mut seen, "live", &mut got).await;
    within("restart", talker.kill(false)).await.unwrap();
    within("say", talker.call::<String, ()>("say", &"after".into()))
        .await
        .unwrap();
    until(&mut seen, "after", &mut got).await;
    assert_eq!(got, ["hello", "before", "live", "hello", "after"]);
    within("kill", talker.kill(true)).await.unwrap();
    let out = within(
        "the follower returns once the actor ended",
        tokio::task::spawn_blocking(move || follower.wait_with_output()),
    )
    .await
    .unwrap()
    .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{err}");
    let id = talker.id().0;
    let node = cluster.nodes()[0].0;
    let marks: Vec<&str> = err.lines().filter(|l| l.contains(" of actor ")).collect();
    assert_eq!(
        marks,
        [
            format!("escher: incarnation 1 of actor {id} on node {node}"),
            format!("escher: incarnation 2 of actor {id} on node {node}"),
        ],
        "{err}"
    );
}

/// The calls waiting at an actor (queued or running) are seen through `ResolveActor` and
/// `escher actors` as its worker's heartbeats report them: several while five slow calls are
/// in flight, none once they were answered.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_calls_waiting_at_an_actor_are_seen_by_resolve_and_escher_actors() {
    let (cluster, client) = start(1).await;
    let counter = within("create", client.actor(Task::actor_typed("Counter", &0u64)))
        .await
        .unwrap();
    let _: u64 = within("a call", counter.call("get", &())).await.unwrap();
    let idle = eventually("the worker to report the actor idle", || {
        let counter = counter.clone();
        async move { counter.describe().await.ok()?.pending_calls }
    })
    .await;
    assert_eq!(idle, 0);
    // Five calls of a second each, one at a time: some wait long enough to be reported.
    let slow: Vec<_> = (0..5)
        .map(|_| {
            let counter = counter.clone();
            tokio::spawn(async move { counter.call::<u64, u64>("slow", &1_000).await })
        })
        .collect();
    let busy = eventually("the worker to report calls waiting", || {
        let counter = counter.clone();
        async move {
            counter
                .describe()
                .await
                .ok()?
                .pending_calls
                .filter(|n| *n >= 2)
        }
    })
    .await;
    assert!(busy <= 5, "{busy} calls waiting, of five");
    // `escher status` totals the calls waiting at every actor the caller sees.
    let total = client.cluster_status().await.unwrap().pending_actor_calls;
    assert!(total.is_some_and(|n| (1..=5).contains(&n)), "{total:?}");
    let (head, token) = (
        cluster.head_url().to_string(),
        cluster.admin_token().to_string(),
    );
    let cli = move |args: &'static [&'static str]| {
        let (head, token) = (head.clone(), token.clone());
        tokio::task::spawn_blocking(move || {
            std::process::Command::new(common::escher_bin())
                .args(args)
                .env("ESCHER_HEAD", head)
                .env("ESCHER_TOKEN", token)
                .env_remove("ESCHER_ACCESS_FILE")
                .env("ESCHER_HOME", "/nonexistent/escher-actors-test")
                .output()
                .expect("the escher CLI runs")
        })
    };
    let out = cli(&["status"]).await.unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        text.contains(" call waiting (") || text.contains(" calls waiting ("),
        "escher status totals the waiting calls:\n{text}"
    );
    let out = tokio::task::spawn_blocking({
        let (head, token) = (
            cluster.head_url().to_string(),
            cluster.admin_token().to_string(),
        );
        move || {
            std::process::Command::new(common::escher_bin())
                .args(["actors", "--json"])
                .env("ESCHER_HEAD", head)
                .env("ESCHER_TOKEN", token)
                .env_remove("ESCHER_ACCESS_FILE")
                .env("ESCHER_HOME", "/nonexistent/escher-actors-test")
                .output()
                .expect("the escher CLI runs")
        }
    })
    .await
    .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let rows: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let shown = rows[0]["pending_calls"].as_u64();
    assert!(
        shown.is_some_and(|n| n <= 5),
        "escher actors shows the waiting calls: {rows}"
    );
    for call in slow {
        within("a slow call", call).await.unwrap().unwrap();
    }
    eventually("the worker to report the actor idle again", || {
        let counter = counter.clone();
        async move { (counter.describe().await.ok()?.pending_calls? == 0).then_some(()) }
    })
    .await;
    eventually("escher status to total no waiting call", || {
        let client = client.clone();
        async move { (client.cluster_status().await.ok()?.pending_actor_calls? == 0).then_some(()) }
    })
    .await;
    let out = cli(&["status"]).await.unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        text.contains("1 actor: 1 running, 0 pending or restarting, 0 calls waiting"),
        "{text}"
    );
}

/// The events of `watch` about `actor` (its task's `Started` and its actor events), until one
/// satisfies `last`; all of them, that one included.
async fn actor_events(
    watch: &mut escher::Watch,
    actor: TaskId,
    last: impl Fn(&ClusterEvent) -> bool,
) -> Vec<WatchEvent> {
    let mut seen = Vec::new();
    loop {
        let event = within("an actor event", watch.next())
            .await
            .expect("the watch goes on")
            .expect("an event, not an error");
        if event.event.task() != Some(actor) {
            continue;
        }
        let done = last(&event.event);
        seen.push(event);
        if done {
            return seen;
        }
    }
}

/// An event as a short line: `started #1`, `ready #1`, `restarting #1`, `died #2`.
fn line(event: &WatchEvent) -> String {
    match &event.event {
        ClusterEvent::Started { attempt, .. } => format!("started #{attempt}"),
        ClusterEvent::Actor {
            change,
            incarnation,
            ..
        } => format!("{change} #{incarnation}"),
        other => other.to_string(),
    }
}

fn died(event: &ClusterEvent) -> bool {
    matches!(
        event,
        ClusterEvent::Actor {
            change: ActorChange::Died,
            ..
        }
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn watchers_see_an_actor_ready_restarting_and_dead_beside_its_task_attempts() {
    let (cluster, client) = start(1).await;
    let node = cluster.nodes()[0];
    let mut watch = within(
        "watch",
        client.watch(WatchRequest::all().kinds([WatchKind::Started, WatchKind::Actor])),
    )
    .await
    .unwrap();
    let counter = within(
        "create",
        client.actor(
            Task::actor_typed("Counter", &10u64)
                .actor_name("watched")
                .max_restarts(1),
        ),
    )
    .await
    .unwrap();
    let _: u64 = within("call", counter.call("get", &())).await.unwrap();
    let _ = within("panic", counter.call::<(), ()>("panic", &())).await;
    let _: u64 = within("after the restart", counter.call("get", &()))
        .await
        .unwrap();
    let _ = within("panic again", counter.call::<(), ()>("panic", &())).await;
    let events = actor_events(&mut watch, counter.id(), died).await;
    let lines: Vec<String> = events.iter().map(line).collect();
    assert_eq!(
        lines,
        [
            "started #1",
            "ready #1",
            "restarting #1",
            "started #2",
            "ready #2",
            "died #2"
        ],
        "{events:#?}"
    );
    for e in &events {
        if let ClusterEvent::Actor {
            name,
            node: on,
            reason,
            change,
            ..
        } = &e.event
        {
            assert_eq!(name.as_deref(), Some("watched"));
            assert_eq!(*on, Some(node));
            match change {
                ActorChange::Ready => assert_eq!(reason, &None),
                // The end of an incarnation names why, as a caller's ActorDiedError does.
                ActorChange::Restarting | ActorChange::Died => assert!(
                    reason
                        .as_deref()
                        .is_some_and(|r| r.contains("asked to panic")),
                    "{e:?}"
                ),
            }
        }
    }
    assert!(
        events[5].event.to_string().starts_with(&format!(
            "actor {} (watched) died in incarnation 2",
            counter.id()
        )),
        "{}",
        events[5].event
    );

    // Ready means the constructor returned: a slow one is ready only after it did.
    let slow = within("create", client.actor(Task::actor_typed("Slow", &300u64)))
        .await
        .unwrap();
    let events = actor_events(&mut watch, slow.id(), |e| {
        matches!(
            e,
            ClusterEvent::Actor {
                change: ActorChange::Ready,
                ..
            }
        )
    })
    .await;
    assert_eq!(
        events.iter().map(line).collect::<Vec<_>>(),
        ["started #1", "ready #1"]
    );
    let made = SLOW_MADE_AT_MS.load(Ordering::SeqCst);
    assert!(made > 0, "the constructor ran");
    assert!(
        events[1].at_ms >= made,
        "ready was committed at {} before the constructor returned at {made}",
        events[1].at_ms
    );

    // A constructor that fails: never ready, dead with its reason. The handle is kept until
    // the death is seen: the last handle of an owned actor dropped ends it ("cancelled by
    // request"), which would race the constructor's own failure.
    let bad = within("create", client.actor(Task::actor_typed("Picky", &"")))
        .await
        .unwrap();
    let events = actor_events(&mut watch, bad.id(), died).await;
    drop(bad);
    assert_eq!(
        events.iter().map(line).collect::<Vec<_>>(),
        ["started #1", "died #1"]
    );
    let ClusterEvent::Actor { reason, .. } = &events[1].event else {
        unreachable!()
    };
    assert!(
        reason
            .as_deref()
            .is_some_and(|r| r.contains("the word is empty")),
        "{reason:?}"
    );

    // A watch of one actor's id sees its actor events too.
    let mut one = within("watch one", client.watch(WatchRequest::tasks([slow.id()])))
        .await
        .unwrap();
    within("kill", slow.kill(true)).await.unwrap();
    let events = actor_events(&mut one, slow.id(), died).await;
    assert!(
        events.iter().all(|e| e.event.task() == Some(slow.id())),
        "{events:?}"
    );
    let ClusterEvent::Actor { reason, .. } = &events.last().unwrap().event else {
        unreachable!()
    };
    assert!(
        reason.as_deref().is_some_and(|r| r.contains("cancelled")),
        "{reason:?}"
    );
}

// ---- faults ---------------------------------------------------------------------------------

/// The leader of a three-replica head stopped while four callers call four actors: calls go to
/// the workers, not the head, so none fails; no actor is lost, restarted or made twice (a
/// failover shorter than the workers' lease stops nothing); the new leader takes a new actor;
/// and a new client that resolves each actor by name through the new leader reaches the same
/// incarnation, whose state counts every call once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_leader_of_three_heads_stopped_under_an_actor_workload_loses_and_doubles_no_actor() {
    const CALLS: u64 = 40;
    let mut cluster = within(
        "starting three heads",
        cluster()
            .heads(3)
            .functions(common::functions().actor(counter()))
            .workers(2)
            .start(),
    )
    .await
    .expect("the cluster starts");
    let client = within("connecting", cluster.client()).await.unwrap();
    let first = eventually("a head replica to lead", || cluster.leader()).await;
    let mut actors = Vec::new();
    for i in 0..4 {
        let task = Task::actor_typed("Counter", &0u64)
            .actor_name(format!("a{i}"))
            .max_restarts(1);
        actors.push(within("create", client.actor(task)).await.unwrap());
    }
    let callers: Vec<_> = actors
        .iter()
        .map(|actor| {
            let actor = actor.clone();
            tokio::spawn(async move {
                for _ in 0..CALLS {
                    let _: u64 = actor.call("add", &1u64).await?;
                    tokio::time::sleep(Duration::from_millis(10)).await;
                }
                Ok::<_, ClientError>(())
            })
        })
        .collect();
    tokio::time::sleep(Duration::from_millis(100)).await;
    cluster.stop_head(first).await;
    let second = eventually("a new leader", || cluster.leader()).await;
    assert_ne!(second, first, "a new leader was elected");
    for caller in callers {
        within("a caller's calls", caller)
            .await
            .unwrap()
            .expect("every call through the failover is answered");
    }
    // The new leader takes writes: one more actor.
    let after = within(
        "an actor made after the failover",
        client.actor(Task::actor_typed("Counter", &7u64).actor_name("after")),
    )
    .await
    .unwrap();
    let n: u64 = within("call it", after.call("get", &())).await.unwrap();
    assert_eq!(n, 7);

    let other = within("a new client", cluster.client()).await.unwrap();
    for (i, actor) in actors.iter().enumerate() {
        let found = within("resolve by name", other.actor_named(&format!("a{i}")))
            .await
            .unwrap();
        assert_eq!(found.id(), actor.id(), "a{i} is the same actor");
        let n: u64 = within("get", found.call("get", &())).await.unwrap();
        assert_eq!(n, CALLS, "a{i} counted each call once, in one incarnation");
        let view = found.describe().await.unwrap();
        assert_eq!(
            (view.state, view.incarnation),
            (TaskState::Running, 1),
            "a{i}: {view:?}"
        );
    }
    let listed = other
        .list_tasks_page(ListTasksRequest {
            labels: vec![(ACTOR_LABEL.to_string(), None)],
            ..ListTasksRequest::default()
        })
        .await
        .unwrap();
    let live: Vec<(TaskId, TaskState, u32)> = listed
        .tasks
        .iter()
        .map(|t| (t.id, t.state, t.attempt))
        .collect();
    let mut expected: Vec<(TaskId, TaskState, u32)> = actors
        .iter()
        .chain([&after])
        .map(|a| (a.id(), TaskState::Running, 1))
        .collect();
    expected.sort();
    let mut live = live;
    live.sort();
    assert_eq!(live, expected, "five actors, each once, none restarted");
    cluster.shutdown().await;
}
