//! End to end: each kind of task through its whole life on a real [`LocalCluster`] (a real
//! head and real workers talking gRPC on loopback).
//!
//! Topics, in order: command tasks (exit codes, logs, environment, timeouts, retries),
//! function tasks (results, errors, panics, unknown names, the result limit), ghost tasks
//! (created resources, TTL, cancel), cancellation, `wait`, pending deadlines, and task hooks.
//!
//! [`LocalCluster`]: escher::LocalCluster

mod common;

use std::time::{Duration, Instant};

use common::{cluster, eventually, finished, resource, running, start, status, units, within};
use escher::client::ResourceUpdateExt;
use escher::types::{
    LogStream, NodeId, NodeSpec, ResourceUpdate, TaskId, TaskResult, TaskState, TaskStatus,
};
use escher::{ClientError, Task};

fn reason(status: &TaskStatus) -> &str {
    status.reason.as_deref().unwrap_or("")
}

// ---- command tasks --------------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn command_exit_codes_logs_and_environment() {
    let (cluster, client) = start(1).await;

    let ok = client
        .submit(Task::command([
            "sh",
            "-c",
            r#"echo to-stdout; echo to-stderr >&2; echo "env $ESCHER_TASK_ID $ESCHER_NODE_ID $ESCHER_HEAD""#,
        ]))
        .await
        .unwrap();
    let done = finished(&client, &ok).await;
    assert_eq!(done.state, TaskState::Succeeded, "{done:?}");
    assert_eq!(done.result, Some(TaskResult::Exited { code: 0 }));
    assert_eq!(done.attempt, 1);
    let node = done.node.expect("a finished task names its node");
    assert_eq!(node, cluster.nodes()[0]);

    let stdout = within("stdout", client.logs(&ok, LogStream::Stdout))
        .await
        .unwrap();
    let stdout = String::from_utf8(stdout).unwrap();
    let expected_env = format!("env {} {} {}", ok.id(), node, cluster.head_url());
    assert_eq!(stdout, format!("to-stdout\n{expected_env}\n"));
    let stderr = within("stderr", client.logs(&ok, LogStream::Stderr))
        .await
        .unwrap();
    assert_eq!(String::from_utf8(stderr).unwrap(), "to-stderr\n");

    let three = client
        .submit(Task::command(["sh", "-c", "echo before; exit 3"]))
        .await
        .unwrap();
    let done = finished(&client, &three).await;
    assert_eq!(done.state, TaskState::Failed, "{done:?}");
    assert_eq!(reason(&done), "exited with code 3");
    assert_eq!(done.result, Some(TaskResult::Exited { code: 3 }));
    let out = client.logs(&three, LogStream::Stdout).await.unwrap();
    assert_eq!(out, b"before\n", "a failed command's output is kept");
    // get_result turns the failure into a typed error that carries the reason.
    match client.get_result(&three, None).await {
        Err(ClientError::TaskFailed { id, state, reason }) => {
            assert_eq!((id, state), (three.id(), TaskState::Failed));
            assert_eq!(reason, "exited with code 3");
        }
        other => panic!("expected TaskFailed, got {other:?}"),
    }

    cluster.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn command_timeout_stops_the_process_early() {
    let (cluster, client) = start(1).await;
    let t0 = Instant::now();
    let task = client
        .submit(Task::command(["sleep", "30"]).timeout(Duration::from_millis(300)))
        .await
        .unwrap();
    let done = finished(&client, &task).await;
    assert_eq!(done.state, TaskState::Failed, "{done:?}");
    assert!(reason(&done).contains("timed out"), "{done:?}");
    assert!(
        t0.elapsed() < Duration::from_secs(20),
        "a 300 ms timeout must not wait for sleep 30 ({:?})",
        t0.elapsed()
    );
    assert!(
        matches!(done.result, Some(TaskResult::Exited { code }) if code != 0),
        "{done:?}"
    );
    cluster.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nonexistent_program_fails_with_its_name() {
    let (cluster, client) = start(1).await;
    let task = client
        .submit(Task::command(["escher-no-such-program-x7", "--flag"]))
        .await
        .unwrap();
    let done = finished(&client, &task).await;
    assert_eq!(done.state, TaskState::Failed, "{done:?}");
    assert!(
        reason(&done).contains("escher-no-such-program-x7"),
        "the reason names the program: {done:?}"
    );
    cluster.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn command_retries_until_success_or_exhaustion() {
    let (cluster, client) = start(1).await;

    let always = client
        .submit(Task::command(["sh", "-c", "exit 1"]).max_retries(2))
        .await
        .unwrap();
    let dir = tempfile::tempdir().unwrap();
    let marker = dir.path().join("first-attempt-ran");
    let flaky = client
        .submit(
            Task::command([
                "sh",
                "-c",
                r#"if [ -e "$1" ]; then echo "attempt $ESCHER_ATTEMPT"; exit 0; fi; touch "$1"; exit 1"#,
                "sh",
                marker.to_str().unwrap(),
            ])
            .max_retries(2),
        )
        .await
        .unwrap();

    let done = finished(&client, &always).await;
    assert_eq!(done.state, TaskState::Failed, "{done:?}");
    assert_eq!(done.attempt, 3, "1 attempt + 2 retries: {done:?}");
    assert_eq!(reason(&done), "exited with code 1");
    assert_eq!(done.result, Some(TaskResult::Exited { code: 1 }));

    let done = finished(&client, &flaky).await;
    assert_eq!(done.state, TaskState::Succeeded, "{done:?}");
    assert_eq!(done.attempt, 2, "{done:?}");
    assert_eq!(done.result, Some(TaskResult::Exited { code: 0 }));
    let out = client.logs(&flaky, LogStream::Stdout).await.unwrap();
    assert_eq!(String::from_utf8_lossy(&out), "attempt 2\n");

    cluster.shutdown().await;
}

// ---- function tasks -------------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn function_results_round_trip() {
    let (cluster, client) = start(2).await;

    let node: u64 = within("nap", async {
        let t = client
            .submit_typed::<u64>(Task::function_typed("nap", &5u64))
            .await?;
        t.get(&client, None).await
    })
    .await
    .unwrap();
    assert!(cluster.nodes().contains(&NodeId(node)), "{node}");

    let bytes: Vec<u8> = (0..=255u8).cycle().take(100_000).collect();
    let echo = client
        .submit(Task::function("echo", bytes.clone()))
        .await
        .unwrap();
    let back = within("echo", client.get_bytes(&echo, None)).await.unwrap();
    assert_eq!(back, bytes);

    // Arguments well above gRPC's default 4 MiB message size reach the worker intact.
    let len = client
        .submit(Task::function("len", vec![1u8; 9 * 1024 * 1024]))
        .await
        .unwrap();
    let n: u64 = within("len", client.get_typed(&len, None)).await.unwrap();
    assert_eq!(n, 9 * 1024 * 1024);

    let unit = client
        .submit(Task::function_typed("noop", &()))
        .await
        .unwrap();
    within("noop", client.get_typed::<()>(&unit, None))
        .await
        .unwrap();

    // A typed get of a command task says what it got instead.
    let cmd = client.submit(Task::command(["true"])).await.unwrap();
    let err = within(
        "get_typed of a command",
        client.get_typed::<u64>(&cmd, None),
    )
    .await
    .unwrap_err();
    assert!(
        matches!(err, ClientError::WrongResultKind { .. }),
        "{err:?}"
    );

    cluster.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn function_errors_and_panics_fail_the_task_only() {
    let (cluster, client) = start(1).await;

    let fail = client
        .submit(Task::function_typed("fail", &"disk on fire".to_string()))
        .await
        .unwrap();
    let done = finished(&client, &fail).await;
    assert_eq!(done.state, TaskState::Failed, "{done:?}");
    assert!(reason(&done).contains("disk on fire"), "{done:?}");
    let err = client.get_typed::<()>(&fail, None).await.unwrap_err();
    assert!(err.to_string().contains("disk on fire"), "{err}");

    let boom = client
        .submit(Task::function_typed(
            "panic",
            &"handler exploded".to_string(),
        ))
        .await
        .unwrap();
    let done = finished(&client, &boom).await;
    assert_eq!(done.state, TaskState::Failed, "{done:?}");
    assert!(reason(&done).contains("panicked"), "{done:?}");
    assert!(reason(&done).contains("handler exploded"), "{done:?}");

    // The worker survives its handler's panic and keeps running tasks.
    for _ in 0..3 {
        let t = client
            .submit(Task::function_typed("where", &()))
            .await
            .unwrap();
        let node: u64 = within("where", client.get_typed(&t, None)).await.unwrap();
        assert_eq!(NodeId(node), cluster.nodes()[0]);
    }
    let s = status(&client).await;
    assert!(s.nodes.iter().all(|n| n.alive), "{s:?}");
    assert_eq!(s.running_tasks, 0);

    cluster.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unknown_function_lists_the_registered_ones() {
    let (cluster, client) = start(1).await;
    let t = client
        .submit(Task::function_typed("no_such_fn", &()))
        .await
        .unwrap();
    let done = finished(&client, &t).await;
    assert_eq!(done.state, TaskState::Failed, "{done:?}");
    let why = reason(&done);
    assert!(why.contains("no_such_fn"), "{why}");
    for name in ["echo", "mark_here", "nap", "where"] {
        assert!(why.contains(name), "{name} is not listed in {why:?}");
    }
    cluster.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn results_above_the_head_limit_fail_the_task() {
    let mut config = escher_head::HeadConfig::default();
    config.state.max_result_bytes = 1000;
    let cluster = within("start", cluster().workers(1).head_config(config).start())
        .await
        .unwrap();
    let client = cluster.client().await.unwrap();

    let small = client
        .submit(Task::function_typed("big", &100u64))
        .await
        .unwrap();
    let bytes: Vec<u8> = within("small", client.get_typed(&small, None))
        .await
        .unwrap();
    assert_eq!(bytes.len(), 100);

    let large = client
        .submit(Task::function_typed("big", &5000u64).max_retries(3))
        .await
        .unwrap();
    let done = finished(&client, &large).await;
    assert_eq!(done.state, TaskState::Failed, "{done:?}");
    assert!(reason(&done).contains("limit of 1000 bytes"), "{done:?}");
    assert_eq!(
        done.attempt, 1,
        "a result too large is not retried: {done:?}"
    );
    assert_eq!(done.result, None);

    cluster.shutdown().await;
}

// ---- ghost tasks ----------------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ghost_creates_resources_for_its_ttl() {
    let (cluster, client) = start(2).await;

    let ghost = client
        .submit(
            Task::ghost()
                .creates("bundle", 2)
                .ttl(Duration::from_secs(1)),
        )
        .await
        .unwrap();
    let live = running(&client, &ghost).await;
    let node = live.node.expect("a running ghost has a node");

    let s = status(&client).await;
    let bundle = resource(&s, node, "bundle").expect("the ghost's bundle exists on its node");
    assert_eq!(bundle.total, units(2));
    for other in cluster.nodes().into_iter().filter(|n| *n != node) {
        assert_eq!(resource(&s, other, "bundle"), None);
    }

    // Tasks that request the bundle run on the ghost's node.
    let members = client
        .submit_batch((0..2).map(|_| Task::function_typed("where", &()).resource("bundle", 1)))
        .await
        .unwrap();
    for m in &members {
        let ran: u64 = within("member", client.get_typed(m, None)).await.unwrap();
        assert_eq!(NodeId(ran), node);
    }

    let done = finished(&client, &ghost).await;
    assert_eq!(done.state, TaskState::Succeeded, "{done:?}");
    assert_eq!(done.result, Some(TaskResult::Released));
    eventually("the bundle disappears", || async {
        resource(&status(&client).await, node, "bundle")
            .is_none()
            .then_some(())
    })
    .await;

    cluster.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ghost_without_ttl_lives_until_cancelled() {
    let (cluster, client) = start(1).await;
    let ghost = client
        .submit(
            Task::ghost()
                .resource("cpu", 1)
                .creates("lock", "unbounded"),
        )
        .await
        .unwrap();
    let live = running(&client, &ghost).await;
    let node = live.node.unwrap();
    let s = status(&client).await;
    assert!(resource(&s, node, "lock").is_some(), "{s:?}");
    assert_eq!(
        resource(&s, node, "cpu").unwrap().used.to_string(),
        "1",
        "the ghost holds its cpu"
    );

    // Still alive a while later: only a cancel ends it.
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(
        client.task_info(&ghost).await.unwrap().status.state,
        TaskState::Running
    );

    let after = within("cancel", client.cancel([&ghost])).await.unwrap();
    assert_eq!(after.len(), 1);
    let done = finished(&client, &ghost).await;
    assert_eq!(done.state, TaskState::Cancelled, "{done:?}");
    let s = eventually("the ghost's resources go", || async {
        let s = status(&client).await;
        (resource(&s, node, "lock").is_none()).then_some(s)
    })
    .await;
    assert_eq!(resource(&s, node, "cpu").unwrap().used.to_string(), "0");

    cluster.shutdown().await;
}

// ---- cancellation ---------------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cancelling_a_pending_task_ends_it_at_once() {
    let (cluster, client) = start(1).await;
    let t = client
        .submit(Task::command(["true"]).resource("nowhere-res", 1))
        .await
        .unwrap();
    let info = client.task_info(&t).await.unwrap();
    assert_eq!(info.status.state, TaskState::Pending);

    let reply = within("cancel", client.cancel([&t])).await.unwrap();
    assert_eq!(reply.len(), 1);
    assert_eq!(reply[0].state, TaskState::Cancelled, "{reply:?}");
    assert!(reason(&reply[0]).contains("cancelled"), "{reply:?}");
    let done = finished(&client, &t).await;
    assert_eq!(done.state, TaskState::Cancelled);
    assert_eq!(done.attempt, 0, "it never ran");
    assert_eq!(status(&client).await.pending_tasks, 0);

    // Cancelling a finished task leaves it as it was.
    let ok = client.submit(Task::command(["true"])).await.unwrap();
    assert_eq!(finished(&client, &ok).await.state, TaskState::Succeeded);
    let reply = client.cancel([&ok]).await.unwrap();
    assert_eq!(reply[0].state, TaskState::Succeeded);

    cluster.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cancelling_a_running_command_stops_it_and_frees_its_resources() {
    let (cluster, client) = start(1).await;
    let long = client
        .submit(Task::command(["sleep", "30"]).resource("cpu", 4))
        .await
        .unwrap();
    running(&client, &long).await;
    // The whole node is taken: a second task waits.
    let next = client
        .submit(Task::command(["true"]).resource("cpu", 4))
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert_eq!(
        client.task_info(&next).await.unwrap().status.state,
        TaskState::Pending
    );

    let t0 = Instant::now();
    within("cancel", client.cancel([&long])).await.unwrap();
    let done = finished(&client, &long).await;
    assert_eq!(done.state, TaskState::Cancelled, "{done:?}");
    assert!(
        t0.elapsed() < Duration::from_secs(15),
        "cancel must not wait for sleep 30 ({:?})",
        t0.elapsed()
    );
    let done = finished(&client, &next).await;
    assert_eq!(done.state, TaskState::Succeeded, "{done:?}");

    cluster.shutdown().await;
}

// ---- wait -----------------------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn wait_follows_ray_semantics() {
    let (cluster, client) = start(1).await;
    let a = client
        .submit(Task::function_typed("nap", &10u64))
        .await
        .unwrap();
    let b = client
        .submit(Task::function_typed("nap", &20u64))
        .await
        .unwrap();
    // Never runs: nothing has this resource.
    let stuck = client
        .submit(Task::function_typed("noop", &()).resource("never-there", 1))
        .await
        .unwrap();
    let ids: Vec<TaskId> = vec![a.id(), stuck.id(), b.id()];

    // num_returns = 2: returns once a and b are done, with the stuck one not ready.
    let (ready, not_ready) = within("wait 2", client.wait(ids.clone(), 2, None))
        .await
        .unwrap();
    let mut ready_ids: Vec<TaskId> = ready.iter().map(|s| s.id).collect();
    ready_ids.sort();
    let mut expected = vec![a.id(), b.id()];
    expected.sort();
    assert_eq!(ready_ids, expected);
    assert!(ready.iter().all(|s| s.state == TaskState::Succeeded));
    assert_eq!(not_ready, vec![stuck.id()]);

    // num_returns = 1 of (stuck, a): a is already done.
    let (ready, not_ready) = within("wait 1", client.wait([stuck.id(), a.id()], 1, None))
        .await
        .unwrap();
    assert_eq!(ready.len(), 1);
    assert_eq!(ready[0].id, a.id());
    assert_eq!(not_ready, vec![stuck.id()]);

    // num_returns = 3 with a timeout: returns when the timeout passes, with what is ready.
    let t0 = Instant::now();
    let (ready, not_ready) = within(
        "wait with timeout",
        client.wait(ids.clone(), 3, Some(Duration::from_millis(300))),
    )
    .await
    .unwrap();
    assert!(
        t0.elapsed() >= Duration::from_millis(250),
        "{:?}",
        t0.elapsed()
    );
    assert_eq!(ready.len(), 2);
    assert_eq!(not_ready, vec![stuck.id()]);

    // get on a task that does not finish times out with a retryable error.
    let err = client
        .get(&stuck, Some(Duration::from_millis(100)))
        .await
        .unwrap_err();
    assert!(matches!(err, ClientError::Timeout { .. }), "{err:?}");
    assert!(err.is_retryable());

    // Client-side checks: num_returns out of range, duplicates.
    let err = client.wait(ids.clone(), 4, None).await.unwrap_err();
    assert!(matches!(err, ClientError::Usage(_)), "{err:?}");
    let err = client.wait([a.id(), a.id()], 1, None).await.unwrap_err();
    assert!(matches!(err, ClientError::Usage(_)), "{err:?}");

    client.cancel([&stuck]).await.unwrap();
    cluster.shutdown().await;
}

// ---- pending deadline -----------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pending_deadline_cancels_a_task_that_cannot_run() {
    let (cluster, client) = start(1).await;
    let t0 = Instant::now();
    let t = client
        .submit(
            Task::function_typed("noop", &())
                .resource("absent-res", 1)
                .pending_deadline(Duration::from_millis(300)),
        )
        .await
        .unwrap();
    let done = finished(&client, &t).await;
    assert_eq!(done.state, TaskState::Cancelled, "{done:?}");
    assert!(reason(&done).contains("deadline"), "{done:?}");
    assert!(
        t0.elapsed() >= Duration::from_millis(250),
        "{:?}",
        t0.elapsed()
    );
    assert_eq!(done.attempt, 0);

    // A task that can run is not affected by its deadline.
    let ok = client
        .submit(Task::function_typed("noop", &()).pending_deadline(Duration::from_millis(300)))
        .await
        .unwrap();
    assert_eq!(finished(&client, &ok).await.state, TaskState::Succeeded);
    cluster.shutdown().await;
}

// ---- hooks ----------------------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_start_hook_creates_a_resource_while_the_task_runs() {
    let (cluster, client) = start(2).await;
    let hook = ResourceUpdate::set("started-flag", 3, NodeSpec::Local).unwrap();
    let t = client
        .submit(Task::function_typed("nap", &30_000u64).on_start(hook))
        .await
        .unwrap();
    let node = running(&client, &t).await.node.unwrap();
    let s = status(&client).await;
    let flag = resource(&s, node, "started-flag").expect("the hook ran on the task's node");
    assert_eq!(flag.total, units(3));

    // A task requesting it follows to the same node.
    let follower = client
        .submit(Task::function_typed("where", &()).resource("started-flag", 1))
        .await
        .unwrap();
    let ran: u64 = within("follower", client.get_typed(&follower, None))
        .await
        .unwrap();
    assert_eq!(NodeId(ran), node);

    client.cancel([&t]).await.unwrap();
    assert_eq!(finished(&client, &t).await.state, TaskState::Cancelled);
    cluster.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_success_hook_releases_a_waiting_task() {
    let (cluster, client) = start(2).await;
    let waiting = client
        .submit(Task::function_typed("where", &()).resource("after-a", 1))
        .await
        .unwrap();
    let info = eventually("the waiting task's reason", || async {
        let info = client.task_info(&waiting).await.unwrap();
        info.pending_reason.is_some().then_some(info)
    })
    .await;
    assert_eq!(info.status.state, TaskState::Pending);
    assert_eq!(info.pending_reason.unwrap().resource.as_str(), "after-a");

    let signal = ResourceUpdate::set("after-a", 1, NodeSpec::Local).unwrap();
    let a = client
        .submit(Task::function_typed("nap", &50u64).on_success(signal))
        .await
        .unwrap();
    let a_node: u64 = within("a", client.get_typed(&a, None)).await.unwrap();
    let b_node: u64 = within("waiting", client.get_typed(&waiting, None))
        .await
        .unwrap();
    assert_eq!(a_node, b_node, "the waiting task runs where A signalled");

    // A failing task does not signal.
    let never = client
        .submit(Task::function_typed("noop", &()).resource("after-f", 1))
        .await
        .unwrap();
    let signal = ResourceUpdate::set("after-f", 1, NodeSpec::Local).unwrap();
    let f = client
        .submit(Task::function_typed("fail", &"no".to_string()).on_success(signal))
        .await
        .unwrap();
    assert_eq!(finished(&client, &f).await.state, TaskState::Failed);
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert_eq!(
        client.task_info(&never).await.unwrap().status.state,
        TaskState::Pending
    );
    let s = status(&client).await;
    assert!(
        s.nodes.iter().all(|n| n.resource("after-f").is_none()),
        "{s:?}"
    );
    client.cancel([&never]).await.unwrap();

    cluster.shutdown().await;
}
