//! End to end: Rust actors in real worker processes under faults, with real `escher-head`
//! processes (see `procs/mod.rs`). The released `escher-worker` registers no Rust actor class,
//! so the workers here are the test-only `test_actor_worker` example of the worker crate (the
//! same library, with the classes `Locker` and `Tally`; its doc says what they write).
//!
//! What is checked is what the processes did, not only what they reported: `Locker` holds an
//! exclusive lock on a file (`flock`) while an incarnation lives, and each incarnation writes
//! what it did into a journal beside it; `Tally` writes each incarnation it makes into a
//! journal. So "two incarnations never live at once" is the kernel's lock and the journal's
//! order, and "no incarnation made twice" is the journal's lines.
//!
//! - A worker cut off from the head (its streams through a proxy the test blocks; it still
//!   answers callers) ends the actor it hosts when its lease runs out, before the head (after
//!   its heartbeat timeout, twice the lease) restarts the actor on another worker: the old
//!   incarnation releases the lock before the new one takes it, serves no call after that,
//!   and the caller's calls go on at the new incarnation.
//! - The leader of three head processes SIGKILLed while four callers call four actors: calls go
//!   to the workers, not the head, so none fails or runs twice, and no actor is lost, restarted
//!   or made twice.
//!
//! Every wait is bounded ([`WAIT`]); nothing asserts how fast anything is.

mod procs;

use std::path::Path;
use std::time::Duration;

use escher::types::{ACTOR_LABEL, ListTasksRequest, NodeId, TaskId, TaskState};
use escher::{ClientError, Task};
use procs::{ProcessCluster, WAIT, WorkerExtra, eventually};

/// Workers started from now on run the test worker with the Rust actor classes.
fn actor_workers(cluster: &mut ProcessCluster) {
    cluster.next_workers(WorkerExtra {
        binary: Some(procs::example("test_actor_worker")),
        ..WorkerExtra::default()
    });
}

/// Bounds `f` by [`WAIT`], naming `what` if it takes longer.
async fn within<T>(what: &str, f: impl std::future::Future<Output = T>) -> T {
    tokio::time::timeout(WAIT, f)
        .await
        .unwrap_or_else(|_| panic!("timed out after {WAIT:?}: {what}"))
}

/// The lines of a journal, each split into its words.
fn journal(path: &Path) -> Vec<Vec<String>> {
    std::fs::read_to_string(path)
        .unwrap_or_default()
        .lines()
        .map(|l| l.split_whitespace().map(str::to_string).collect())
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_partitioned_workers_actor_is_fenced_before_its_next_incarnation_takes_its_lock() {
    let mut cluster = ProcessCluster::builder().workers(0).start().await;
    actor_workers(&mut cluster);
    let w1 = cluster
        .start_worker_behind_proxy("w1", "cpu=2,memory=512")
        .await;
    let client = cluster.client().await;
    let lock = cluster.dir().join("locker.lock");
    let journal_path = cluster.dir().join("locker.lock.journal");

    // Made while w1 is the only worker: it lives there.
    let locker = within(
        "create the actor",
        client.actor(
            Task::actor_typed("Locker", &lock.display().to_string())
                .actor_name("locker")
                .max_restarts(1)
                .resources_str("cpu=1"),
        ),
    )
    .await
    .unwrap();
    let first: (u32, String) = within("a call", locker.call("hold", &())).await.unwrap();
    assert_eq!(first, (1, "w1".to_string()));
    let w2 = cluster.start_worker("w2", "cpu=2,memory=512").await;

    // A caller that goes on calling through the same handle, across the partition, until the
    // next incarnation has answered it a few times (or the lock saw two holders: then the
    // journal's check below says so).
    let caller = {
        let (locker, journal_path) = (locker.clone(), journal_path.clone());
        tokio::spawn(async move {
            let mut answers: Vec<Result<(u32, String), ClientError>> = Vec::new();
            while answers
                .iter()
                .filter(|a| a.as_ref().is_ok_and(|(k, _)| *k == 2))
                .count()
                < 5
                && !journal(&journal_path).iter().any(|l| l[0] == "conflict")
            {
                answers.push(locker.call("hold", &()).await);
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            answers
        })
    };
    eventually("the caller's calls to reach incarnation 1", WAIT, || {
        let lines = journal(&journal_path);
        async move { (lines.iter().filter(|l| l[0] == "call").count() >= 3).then_some(()) }
    })
    .await;
    cluster.cut_worker_links(true);
    let answers = within("the caller reaches the next incarnation", caller)
        .await
        .unwrap();
    let lines = journal(&journal_path);
    assert!(
        !lines.iter().any(|l| l[0] == "conflict"),
        "two incarnations would have held the lock at once: {lines:?}"
    );

    // The head restarted the actor on w2 once it counted w1 lost; w1's process lived on
    // throughout, cut off from the head but not from the caller.
    let view = locker.describe().await.unwrap();
    assert_eq!(
        (view.state, view.incarnation, view.node),
        (TaskState::Running, 2, Some(w2)),
        "{view:?}"
    );
    assert!(cluster.worker_running("w1"), "w1 was cut off, not killed");
    // Fenced by the runtime's lease timer, or by the actor's own check when a call reached it
    // first (the caller goes on calling across the partition): either way, said in the log.
    let output = cluster.worker_output("w1");
    assert!(
        output.contains("ending the actors and function tasks this worker hosts")
            || output.contains("ending an actor this worker hosts: the worker's lease ran out"),
        "w1 fenced its actor:\n{output}"
    );

    // The caller saw incarnation 1 on w1, then incarnation 2 on w2, never back; a call that
    // failed in between failed as a call to a dead actor.
    let served: Vec<(u32, String)> = answers
        .iter()
        .filter_map(|a| a.as_ref().ok())
        .cloned()
        .collect();
    let switch = served.iter().position(|(k, _)| *k == 2).unwrap();
    assert!(
        served[..switch].iter().all(|a| *a == (1, "w1".to_string()))
            && served[switch..].iter().all(|a| *a == (2, "w2".to_string())),
        "{answers:?}"
    );
    for failed in answers.iter().filter_map(|a| a.as_ref().err()) {
        assert!(matches!(failed, ClientError::ActorDied { .. }), "{failed}");
    }

    // The lock's own record: incarnation 1 took it, served, and let it go before incarnation 2
    // took it; never a conflict, and nothing of incarnation 1 after its release.
    let kinds = |lines: &[Vec<String>]| -> Vec<String> {
        let mut kinds: Vec<String> = lines
            .iter()
            .map(|l| format!("{} {} {}", l[0], l[1], l[2]))
            .collect();
        kinds.dedup();
        kinds
    };
    let lines = journal(&journal_path);
    assert_eq!(
        kinds(&lines),
        [
            "take 1 w1",
            "call 1 w1",
            "release 1 w1",
            "take 2 w2",
            "call 2 w2"
        ],
        "{lines:?}"
    );

    // w1 comes back: it reports its fenced incarnation, which the head (that counted the node
    // lost and restarted the actor) ignores. The actor stays incarnation 2 on w2.
    cluster.cut_worker_links(false);
    cluster
        .wait_status("w1 to be a live node again", |s| {
            s.nodes
                .iter()
                .any(|n| n.name == "w1" && n.alive)
                .then_some(())
        })
        .await;
    let again: (u32, String) = within("a call after the heal", locker.call("hold", &()))
        .await
        .unwrap();
    assert_eq!(again, (2, "w2".to_string()));
    let view = locker.describe().await.unwrap();
    assert_eq!((view.incarnation, view.node), (2, Some(w2)), "{view:?}");
    let _ = w1;

    within("kill", locker.kill(true)).await.unwrap();
    eventually("incarnation 2 to release the lock", WAIT, || {
        let lines = journal(&journal_path);
        async move {
            lines
                .last()
                .is_some_and(|l| l[0] == "release")
                .then_some(())
        }
    })
    .await;
    let lines = journal(&journal_path);
    assert_eq!(
        kinds(&lines),
        [
            "take 1 w1",
            "call 1 w1",
            "release 1 w1",
            "take 2 w2",
            "call 2 w2",
            "release 2 w2"
        ],
        "{lines:?}"
    );
}

/// The leader of three head processes SIGKILLed while four callers call four actors. The
/// workers' lease (half the heartbeat timeout, 10 s here) outlasts the failover, and a
/// failover shorter than the lease stops nothing: every call is answered once, in order (the
/// k-th `add(1)` of a caller answers k), and each actor keeps its one incarnation.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_leader_of_three_head_processes_sigkilled_under_actor_calls_loses_and_doubles_nothing()
{
    const ACTORS: usize = 4;
    const CALLS: u64 = 40;
    let mut cluster = ProcessCluster::builder()
        .heads(3)
        .workers(0)
        .heartbeat_timeout_ms(20_000)
        .start()
        .await;
    actor_workers(&mut cluster);
    cluster.start_worker("w1", "cpu=4,memory=512").await;
    cluster.start_worker("w2", "cpu=4,memory=512").await;
    let made = cluster.dir().join("tally.journal");
    let made_arg = made.display().to_string();
    let client = cluster.client().await;
    let leader = cluster.wait_leader().await;

    let mut actors = Vec::new();
    for i in 0..ACTORS {
        let task = Task::actor_typed("Tally", &made_arg)
            .actor_name(format!("t{i}"))
            .max_restarts(1)
            .resources_str("cpu=1");
        actors.push(within("create", client.actor(task)).await.unwrap());
    }
    let callers: Vec<_> = actors
        .iter()
        .map(|actor| {
            let actor = actor.clone();
            tokio::spawn(async move {
                for k in 1..=CALLS {
                    let n: u64 = actor.call("add", &1u64).await?;
                    assert_eq!(n, k, "actor {}: call {k} answered {n}", actor.id());
                    tokio::time::sleep(Duration::from_millis(20)).await;
                }
                Ok::<_, ClientError>(())
            })
        })
        .collect();
    eventually("the callers to be under way", WAIT, || {
        let actors = actors.clone();
        async move {
            for a in &actors {
                let n: u64 = a.call("get", &()).await.ok()?;
                if n < 3 {
                    return None;
                }
            }
            Some(())
        }
    })
    .await;
    cluster.kill_head_at(leader);
    let second = cluster.wait_leader().await;
    assert_ne!(second, leader, "a new leader was elected");
    for caller in callers {
        within("a caller's calls", caller)
            .await
            .unwrap()
            .expect("every call through the failover is answered");
    }

    // The new leader takes writes: one more actor.
    let after = within(
        "an actor made after the failover",
        client.actor(
            Task::actor_typed("Tally", &made_arg)
                .actor_name("after")
                .resources_str("cpu=1"),
        ),
    )
    .await
    .unwrap();
    let n: u64 = within("call it", after.call("add", &5u64)).await.unwrap();
    assert_eq!(n, 5);

    // A new client resolves each actor by name through the new leader: the same incarnation,
    // which counted each call once.
    let other = cluster.client().await;
    for (i, actor) in actors.iter().enumerate() {
        let found = within("resolve by name", other.actor_named(&format!("t{i}")))
            .await
            .unwrap();
        assert_eq!(found.id(), actor.id(), "t{i} is the same actor");
        let n: u64 = within("get", found.call("get", &())).await.unwrap();
        assert_eq!(n, CALLS, "t{i} counted each call once");
        let view = found.describe().await.unwrap();
        assert_eq!(
            (view.state, view.incarnation),
            (TaskState::Running, 1),
            "t{i}: {view:?}"
        );
    }
    let listed = other
        .list_tasks_page(ListTasksRequest {
            labels: vec![(ACTOR_LABEL.to_string(), None)],
            ..ListTasksRequest::default()
        })
        .await
        .unwrap();
    let mut live: Vec<(TaskId, TaskState, u32)> = listed
        .tasks
        .iter()
        .map(|t| (t.id, t.state, t.attempt))
        .collect();
    live.sort();
    let mut expected: Vec<(TaskId, TaskState, u32)> = actors
        .iter()
        .chain([&after])
        .map(|a| (a.id(), TaskState::Running, 1))
        .collect();
    expected.sort();
    assert_eq!(live, expected, "five actors, each once, none restarted");

    // The workers' own record: each actor made once, as incarnation 1, in all.
    let mut lines: Vec<(u64, u32)> = journal(&made)
        .iter()
        .map(|l| (l[1].parse().unwrap(), l[2].parse().unwrap()))
        .collect();
    lines.sort();
    let mut each_once: Vec<(u64, u32)> = actors
        .iter()
        .chain([&after])
        .map(|a| (a.id().0, 1))
        .collect();
    each_once.sort();
    assert_eq!(lines, each_once, "every incarnation ever made");
}

/// A journal's lines as `EVENT ATTEMPT WORKER`, repeats of one line folded into one.
fn folded(lines: &[Vec<String>]) -> Vec<String> {
    let mut kinds: Vec<String> = lines.iter().map(|l| l.join(" ")).collect();
    kinds.dedup();
    kinds
}

/// A Rust function task runs inside the worker process, which the fence supervisor does not
/// kill: a worker cut off from the head (its streams through a proxy the test blocks) stops the
/// task's handler when its lease runs out, before the head (after its heartbeat timeout, twice
/// the lease) retries the task on another worker. `lock_for` holds a file lock while it runs,
/// so that two live attempts would be a `conflict` in the journal and a failed retry.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_partitioned_workers_function_task_is_stopped_before_its_retry_takes_its_lock() {
    let mut cluster = ProcessCluster::builder().workers(0).start().await;
    actor_workers(&mut cluster);
    cluster
        .start_worker_behind_proxy("w1", "cpu=2,memory=512")
        .await;
    let client = cluster.client().await;
    let lock = cluster.dir().join("task.lock");
    let journal_path = cluster.dir().join("task.lock.journal");

    // Submitted while w1 is the only worker: attempt 1 runs there, for 12 s unless stopped.
    let task = client
        .submit_typed::<(u32, String)>(
            Task::function_typed("lock_for", &(lock.display().to_string(), 12_000u64))
                .max_retries(1)
                .resources_str("cpu=1"),
        )
        .await
        .unwrap();
    eventually("attempt 1 to hold the lock", WAIT, || {
        let lines = journal(&journal_path);
        async move { lines.iter().any(|l| l[0] == "tick").then_some(()) }
    })
    .await;
    let w2 = cluster.start_worker("w2", "cpu=2,memory=512").await;
    cluster.cut_worker_links(true);

    let done = within("the retry's result", task.get(&client, None)).await;
    let lines = journal(&journal_path);
    assert!(
        !lines.iter().any(|l| l[0] == "conflict"),
        "two attempts would have held the lock at once: {lines:?}"
    );
    assert_eq!(done.unwrap(), (2, "w2".to_string()), "{lines:?}");
    // Attempt 1 let go of the lock before attempt 2 took it, and did nothing after.
    assert_eq!(
        folded(&lines),
        [
            "take 1 w1",
            "tick 1 w1",
            "release 1 w1",
            "take 2 w2",
            "tick 2 w2",
            "release 2 w2"
        ],
        "{lines:?}"
    );
    assert!(cluster.worker_running("w1"), "w1 was cut off, not killed");
    assert!(
        cluster
            .worker_output("w1")
            .contains("ending the actors and function tasks this worker hosts"),
        "w1 fenced its function task:\n{}",
        cluster.worker_output("w1")
    );
    let info = client.task_info(task.id()).await.unwrap();
    let nodes: Vec<(u32, NodeId)> = info.attempts.iter().map(|a| (a.attempt, a.node)).collect();
    assert_eq!(nodes.last(), Some(&(2, w2)), "{info:?}");
}

/// A SIGSTOPped worker cannot let go of what its Rust actor holds inside its process (here a
/// file lock): the kernel keeps it until the process resumes or dies. The head restarts the
/// actor elsewhere after its heartbeat timeout; the next incarnation finds the lock held and
/// waits for it (the documented gap: docs/client.md "Actors"). When the worker resumes, it
/// serves no call (its lease has run out: a call queued while it was stopped fails as a call
/// to a dead actor), ends its incarnation, and so frees the lock for the next one.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stopped_workers_actor_holds_its_lock_until_it_resumes_and_then_serves_no_call() {
    let mut cluster = ProcessCluster::builder().workers(0).start().await;
    actor_workers(&mut cluster);
    cluster.start_worker("w1", "cpu=2,memory=512").await;
    let client = cluster.client().await;
    let lock = cluster.dir().join("patient.lock");
    let journal_path = cluster.dir().join("patient.lock.journal");
    let locker = within(
        "create the actor",
        client.actor(
            Task::actor_typed("PatientLocker", &(lock.display().to_string(), 60_000u64))
                .max_restarts(1)
                .resources_str("cpu=1"),
        ),
    )
    .await
    .unwrap();
    let first: (u32, String) = within("a call", locker.call("hold", &())).await.unwrap();
    assert_eq!(first, (1, "w1".to_string()));
    let w2 = cluster.start_worker("w2", "cpu=2,memory=512").await;

    cluster.freeze_worker("w1", true);
    // A call sent to the stopped worker: it waits in the kernel's buffers until w1 resumes.
    let queued = {
        let locker = locker.clone();
        tokio::spawn(async move { locker.call::<_, (u32, String)>("hold", &()).await })
    };
    eventually("incarnation 2 to wait for the lock on w2", WAIT, || {
        let lines = journal(&journal_path);
        async move {
            lines
                .iter()
                .any(|l| l.join(" ") == "wait 2 w2")
                .then_some(())
        }
    })
    .await;
    // The gap: the stopped process still holds the lock.
    tokio::time::sleep(Duration::from_millis(500)).await;
    let lines = journal(&journal_path);
    assert!(
        !lines.iter().any(|l| l[0] == "take" && l[1] == "2"),
        "{lines:?}"
    );

    cluster.freeze_worker("w1", false);
    // A call sent as w1 resumes may still reach it: refused as a call to a dead actor (w1's
    // lease ran out), never served; the caller's next call goes to incarnation 2.
    let mut refused = Vec::new();
    let again = loop {
        match within(
            "a call after w1 resumed",
            locker.call::<_, (u32, String)>("hold", &()),
        )
        .await
        {
            Ok(answer) => break answer,
            Err(e) if refused.len() < 3 => refused.push(e),
            Err(e) => panic!("{e}; before: {refused:?}"),
        }
    };
    assert_eq!(again, (2, "w2".to_string()));
    for e in &refused {
        assert!(
            matches!(e, ClientError::ActorDied { reason, .. } if reason.contains("fenced")),
            "{e}"
        );
    }
    match within("the call queued on the stopped worker", queued)
        .await
        .unwrap()
    {
        Ok(answer) => assert_eq!(answer, (2, "w2".to_string()), "resent to incarnation 2"),
        Err(e) => assert!(matches!(e, ClientError::ActorDied { .. }), "{e}"),
    }
    let lines = journal(&journal_path);
    assert!(
        !lines.iter().any(|l| l[0] == "conflict"),
        "the next incarnation gave up on the lock: {lines:?}"
    );
    assert_eq!(
        folded(&lines),
        [
            "take 1 w1",
            "call 1 w1",
            "wait 2 w2",
            "release 1 w1",
            "take 2 w2",
            "call 2 w2"
        ],
        "{lines:?}"
    );
    let view = locker.describe().await.unwrap();
    assert_eq!(
        (view.state, view.incarnation, view.node),
        (TaskState::Running, 2, Some(w2)),
        "{view:?}"
    );
    within("kill", locker.kill(true)).await.unwrap();
}
