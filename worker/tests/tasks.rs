//! Running tasks against a fake head: commands (exit codes, logs, environment, cancel,
//! timeout, spawn failure), functions (results, panics, unknown names, bad arguments, the task
//! context) and ghosts (TTL, cancel, many at once).

mod support;

use std::time::{Duration, Instant};

use escher_proto::codec;
use escher_proto::types::{Assignment, HeadMessage, LogChunk, TaskFinished, WorkerMessage};
use escher_proto::{
    Amount, Capacity, CapacityOp, LogStream, NodeId, NodeSpec, ResourceSet, TaskId, TaskKind,
    TaskResult, TaskSpec, wire,
};
use support::{FakeHead, RunningWorker, attached, sh, spec, worker};
use tonic::Status;

const HEARTBEAT: Duration = Duration::from_millis(200);

fn assign(task: u64, spec: TaskSpec) -> HeadMessage {
    HeadMessage::Assign(Assignment {
        task_id: TaskId(task),
        attempt: 1,
        spec,
        allocation: ResourceSet::new(),
        task_token: format!("escher-task-{task}"),
        objects: Vec::new(),
    })
}

fn cancel(task: u64) -> HeadMessage {
    HeadMessage::CancelTask {
        task_id: TaskId(task),
        attempt: 1,
        reason: "test".into(),
        force: false,
    }
}

fn function(name: &str, args: Vec<u8>) -> TaskSpec {
    spec(TaskKind::Function {
        name: name.into(),
        args: args.into(),
    })
}

fn ghost(ttl: Option<Duration>) -> TaskSpec {
    spec(TaskKind::Ghost {
        creates: vec![],
        ttl,
    })
}

/// Expects `TaskStarted` for `task`.
async fn started(head: &mut FakeHead, task: u64) {
    match head.report().await {
        WorkerMessage::TaskStarted { task_id, attempt } => {
            assert_eq!((task_id, attempt), (TaskId(task), 1));
        }
        other => panic!("expected TaskStarted for task {task}, got {other:?}"),
    }
}

/// Expects `TaskFinished` for `task` and returns it.
async fn finished(head: &mut FakeHead, task: u64) -> TaskFinished {
    match head.report().await {
        WorkerMessage::TaskFinished(f) => {
            assert_eq!((f.task_id, f.attempt), (TaskId(task), 1), "{f:?}");
            f
        }
        other => panic!("expected TaskFinished for task {task}, got {other:?}"),
    }
}

/// Assigns `spec` as `task` and returns its report, checking that it started first.
async fn run(head: &mut FakeHead, task: u64, spec: TaskSpec) -> TaskFinished {
    head.send(assign(task, spec));
    started(head, task).await;
    finished(head, task).await
}

/// Fetches a log chunk of attempt 1 through the stream.
async fn fetch(
    head: &mut FakeHead,
    request_id: u64,
    task: u64,
    stream: LogStream,
) -> Result<LogChunk, String> {
    fetch_attempt(head, request_id, (task, 1), stream).await
}

/// Fetches a log chunk of one attempt through the stream.
async fn fetch_attempt(
    head: &mut FakeHead,
    request_id: u64,
    (task, attempt): (u64, u32),
    stream: LogStream,
) -> Result<LogChunk, String> {
    head.send(HeadMessage::FetchLogs {
        request_id,
        task_id: TaskId(task),
        stream,
        offset: 0,
        max_bytes: 0,
        attempt,
    });
    match head.report().await {
        WorkerMessage::Logs {
            request_id: id,
            result,
        } => {
            assert_eq!(id, request_id);
            result
        }
        other => panic!("expected Logs, got {other:?}"),
    }
}

fn typed_worker(head: &FakeHead) -> escher_worker::WorkerBuilder {
    worker(head)
        .typed_function("add", |_ctx, (a, b): (u64, u64)| async move {
            Ok::<_, String>(a + b)
        })
        .function("echo", |_ctx, args| async move { Ok(args) })
        .function("boom", |_ctx, _args| async move {
            if true {
                panic!("kaboom");
            }
            Ok(Vec::new())
        })
        .function(
            "fails",
            |_ctx, _args| async move { Err("nope".to_string()) },
        )
        .function("big", |_ctx, _args| async move {
            Ok(vec![0; escher_worker::MAX_RESULT_BYTES + 1])
        })
}

#[tokio::test]
async fn command_reports_its_exit_code_environment_and_logs() {
    let mut head = FakeHead::start(HEARTBEAT).await;
    let w = RunningWorker::start(worker(&head));
    let (_, node) = attached(&mut head).await;

    let mut task = sh(
        r#"echo "$ESCHER_TASK_ID $ESCHER_ATTEMPT $ESCHER_NODE_ID $ESCHER_NAMESPACE $ESCHER_HEAD"; echo oops >&2; exit 3"#,
    );
    task.labels = "escher.namespace=app1".parse().unwrap();
    let done = run(&mut head, 7, task).await;
    assert_eq!(done.outcome, Ok(TaskResult::Exited { code: 3 }));
    assert!(!done.timed_out);
    // The report carries the end of both streams, for the head to keep.
    let tail = done
        .output
        .expect("a command's report carries its output's tail");
    let line = format!("7 1 {} app1 {}\n", node.0, head.url());
    assert_eq!(
        (tail.stdout, tail.stdout_len),
        (line.clone().into_bytes(), line.len() as u64)
    );
    assert_eq!(
        (tail.stderr.as_slice(), tail.stderr_len),
        (&b"oops\n"[..], 5)
    );

    let out = fetch(&mut head, 1, 7, LogStream::Stdout).await.unwrap();
    let expected = format!("7 1 {} app1 {}\n", node.0, head.url());
    assert_eq!(String::from_utf8_lossy(&out.data), expected);
    assert!(out.eof);
    assert_eq!(out.next_offset, expected.len() as u64);
    let err = fetch(&mut head, 2, 7, LogStream::Stderr).await.unwrap();
    assert_eq!(err.data, b"oops\n");
    let missing = fetch(&mut head, 3, 99, LogStream::Stdout)
        .await
        .unwrap_err();
    assert!(
        missing.contains("no stdout log for task 99 attempt 1"),
        "{missing}"
    );
    // Requests name the attempt: another attempt of task 7 has no log here.
    let other = fetch_attempt(&mut head, 4, (7, 2), LogStream::Stdout)
        .await
        .unwrap_err();
    assert!(other.contains("task 7 attempt 2"), "{other}");

    let ok = run(&mut head, 8, sh("true")).await;
    assert_eq!(ok.outcome, Ok(TaskResult::Exited { code: 0 }));
    w.stop().await.unwrap();
}

#[tokio::test]
async fn cancel_stops_a_long_command_promptly() {
    let mut head = FakeHead::start(HEARTBEAT).await;
    let w = RunningWorker::start(worker(&head));
    attached(&mut head).await;
    head.send(assign(1, sh("exec sleep 30")));
    started(&mut head, 1).await;
    let t = Instant::now();
    head.send(cancel(1));
    let done = finished(&mut head, 1).await;
    assert!(
        t.elapsed() < Duration::from_secs(5),
        "took {:?}",
        t.elapsed()
    );
    // SIGTERM: 128 + 15.
    assert_eq!(done.outcome, Ok(TaskResult::Exited { code: 143 }));
    assert!(!done.timed_out);
    w.stop().await.unwrap();
}

/// A cancel from the head that kills at once (`escher cancel --force`).
fn force_cancel(task: u64) -> HeadMessage {
    HeadMessage::CancelTask {
        task_id: TaskId(task),
        attempt: 1,
        reason: "test".into(),
        force: true,
    }
}

/// A command that says so when it gets SIGTERM, and goes on.
const TRAPS_TERM: &str = "trap 'echo got TERM' TERM; echo up; while :; do sleep 0.05; done";

/// The report of a forced cancel: without the force, the command would run on through the
/// worker's grace of an hour, so a bound far below that (and far above a kill) fails the test
/// instead of hanging it.
async fn killed<F: std::future::Future<Output = TaskFinished>>(report: F) -> TaskFinished {
    tokio::time::timeout(Duration::from_secs(120), report)
        .await
        .expect("a forced cancel kills the command without waiting for its grace")
}

#[tokio::test]
async fn a_forced_cancel_kills_a_command_without_its_grace() {
    let mut head = FakeHead::start(HEARTBEAT).await;
    // A grace longer than the test may take: only a kill without it ends the command.
    let w = RunningWorker::start(worker(&head).grace(Duration::from_secs(3600)));
    attached(&mut head).await;
    head.send(assign(1, sh(TRAPS_TERM)));
    started(&mut head, 1).await;
    head.send(force_cancel(1));
    let done = killed(finished(&mut head, 1)).await;
    // SIGKILL: 128 + 9; no SIGTERM came first, so the trap never ran.
    assert_eq!(done.outcome, Ok(TaskResult::Exited { code: 137 }));
    let out = String::from_utf8_lossy(&done.output.expect("its output").stdout).into_owned();
    assert!(!out.contains("got TERM"), "{out:?}");

    // Forced during the grace of a plain cancel: killed then, not when the grace ends. Its
    // trap is set once it said so: a plain cancel then leaves it running through the grace.
    head.send(assign(2, sh(TRAPS_TERM)));
    started(&mut head, 2).await;
    let mut request = 0;
    loop {
        request += 1;
        let chunk = fetch(&mut head, request, 2, LogStream::Stdout).await;
        if chunk.is_ok_and(|c| c.data.starts_with(b"up")) {
            break;
        }
        assert!(request < 2_000, "the command never said it was up");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    head.send(cancel(2));
    head.send(force_cancel(2));
    let done = killed(async {
        match head.report().await {
            WorkerMessage::TaskFinished(f) => f,
            other => panic!("expected TaskFinished, got {other:?}"),
        }
    })
    .await;
    assert_eq!(done.task_id, TaskId(2));
    // SIGKILL, not SIGTERM (which it traps): the forced cancel, not the plain one, ended it.
    assert_eq!(done.outcome, Ok(TaskResult::Exited { code: 137 }));
    w.stop().await.unwrap();
}

#[tokio::test]
async fn timeout_stops_a_command_and_says_so() {
    let mut head = FakeHead::start(HEARTBEAT).await;
    let w = RunningWorker::start(worker(&head));
    attached(&mut head).await;
    let mut task = sh("exec sleep 30");
    task.timeout = Some(Duration::from_millis(200));
    let done = run(&mut head, 1, task).await;
    assert_eq!(done.outcome, Ok(TaskResult::Exited { code: 143 }));
    assert!(done.timed_out);
    w.stop().await.unwrap();
}

#[tokio::test]
async fn a_command_that_cannot_start_is_an_error() {
    let mut head = FakeHead::start(HEARTBEAT).await;
    let w = RunningWorker::start(worker(&head));
    attached(&mut head).await;
    let task = spec(TaskKind::Command {
        argv: vec!["/nonexistent/escher-test-program".into()],
        env: vec![],
        cwd: None,
    });
    let done = run(&mut head, 1, task).await;
    let err = done.outcome.unwrap_err();
    assert!(err.contains("cannot start program"), "{err}");
    w.stop().await.unwrap();
}

#[tokio::test]
async fn functions_return_bytes_or_errors() {
    let mut head = FakeHead::start(HEARTBEAT).await;
    let w = RunningWorker::start(typed_worker(&head));
    attached(&mut head).await;

    let done = run(
        &mut head,
        1,
        function("add", codec::encode(&(2u64, 3u64)).unwrap()),
    )
    .await;
    let bytes = match done.outcome {
        Ok(TaskResult::Returned(bytes)) => bytes,
        other => panic!("{other:?}"),
    };
    assert_eq!(codec::decode::<u64>(&bytes).unwrap(), 5);

    let done = run(&mut head, 2, function("echo", b"hi".to_vec())).await;
    assert_eq!(
        done.outcome,
        Ok(TaskResult::Returned(b"hi".to_vec().into()))
    );

    let done = run(&mut head, 3, function("fails", vec![])).await;
    assert_eq!(done.outcome, Err("nope".to_string()));

    let done = run(&mut head, 4, function("add", b"\xff".to_vec())).await;
    let err = done.outcome.unwrap_err();
    assert!(err.contains("cannot decode"), "{err}");

    // Past what one message to the head carries: kept in the worker's store as the object
    // `(task, 0)`, the head told only its size and checksum.
    let done = run(&mut head, 5, function("big", vec![])).await;
    let big = escher_worker::MAX_RESULT_BYTES + 1;
    match done.outcome {
        Ok(TaskResult::Object { size, checksum }) => {
            assert_eq!(size, big as u64);
            assert_eq!(checksum, crc32c::crc32c(&vec![0; big]));
        }
        other => panic!("{other:?}"),
    }
    w.stop().await.unwrap();
}

#[tokio::test]
async fn a_panicking_function_fails_and_the_worker_goes_on() {
    let mut head = FakeHead::start(HEARTBEAT).await;
    let w = RunningWorker::start(typed_worker(&head));
    attached(&mut head).await;
    let done = run(&mut head, 1, function("boom", vec![])).await;
    let err = done.outcome.unwrap_err();
    assert!(err.contains("\"boom\" panicked: kaboom"), "{err}");
    let done = run(&mut head, 2, function("echo", b"still here".to_vec())).await;
    assert_eq!(
        done.outcome,
        Ok(TaskResult::Returned(b"still here".to_vec().into()))
    );
    w.stop().await.unwrap();
}

#[tokio::test]
async fn an_unknown_function_names_the_registered_ones() {
    let mut head = FakeHead::start(HEARTBEAT).await;
    let w = RunningWorker::start(typed_worker(&head));
    attached(&mut head).await;
    let done = run(&mut head, 1, function("nope", vec![])).await;
    assert_eq!(
        done.outcome.unwrap_err(),
        r#"no function named "nope" is registered on worker test-worker; registered: add, big, boom, echo, fails"#
    );
    w.stop().await.unwrap();
}

#[tokio::test]
async fn cancel_and_timeout_stop_a_function() {
    let mut head = FakeHead::start(HEARTBEAT).await;
    let builder = worker(&head).function("hang", |_ctx, _args| async move {
        std::future::pending::<()>().await;
        Ok(Vec::new())
    });
    let w = RunningWorker::start(builder);
    attached(&mut head).await;
    head.send(assign(1, function("hang", vec![])));
    started(&mut head, 1).await;
    head.send(cancel(1));
    let done = finished(&mut head, 1).await;
    assert!(done.outcome.unwrap_err().contains("cancelled"));

    let mut task = function("hang", vec![]);
    task.timeout = Some(Duration::from_millis(100));
    let done = run(&mut head, 2, task).await;
    assert!(done.timed_out);
    assert!(done.outcome.unwrap_err().contains("timed out"));
    w.stop().await.unwrap();
}

#[tokio::test]
async fn a_function_sets_resources_on_its_own_node() {
    let mut head = FakeHead::start(HEARTBEAT).await;
    let builder = worker(&head).function("claim", |ctx, _args| async move {
        let name = "slot".try_into().map_err(|e| format!("{e}"))?;
        let op = CapacityOp::Set(Capacity::Finite(
            Amount::units(2).map_err(|e| e.to_string())?,
        ));
        let outcome = ctx
            .set_resource(name, op)
            .await
            .map_err(|e| e.to_string())?;
        let text = format!("{} {} {:?}", ctx.task_id(), ctx.node_id(), outcome.nodes);
        Ok(text.into_bytes())
    });
    let w = RunningWorker::start(builder);
    let (_, node) = attached(&mut head).await;
    let mut task = function("claim", vec![]);
    task.labels = "escher.namespace=app1".parse().unwrap();
    head.send(assign(5, task));
    started(&mut head, 5).await;
    let (call, token) = head.set_resources_call().await;
    // The task calls with the credential of its assignment, which tells the head who calls.
    assert_eq!(token.as_deref(), Some("Bearer escher-task-5"));
    assert_eq!(call.namespace.as_ref().map(|n| n.as_str()), Some("app1"));
    assert_eq!(call.updates.len(), 1);
    assert_eq!(call.updates[0].name.as_str(), "slot");
    assert_eq!(call.updates[0].target, NodeSpec::Local);
    let done = finished(&mut head, 5).await;
    let expected = format!("5 {} {:?}", node.0, vec![NodeId(1)]);
    assert_eq!(
        done.outcome,
        Ok(TaskResult::Returned(expected.into_bytes().into()))
    );
    w.stop().await.unwrap();
}

/// A replica's "not leader" for a write it had proposed and could not answer for (`escher-
/// outcome: may-still-commit`) leaves the write's outcome open: the worker follows the leader
/// by the client's retry rules and sends it again under the same key, and a call that then
/// fails without an answer ends as an unknown outcome, never as a plain failure that would
/// say it was not applied.
#[tokio::test]
async fn a_write_the_head_may_still_commit_is_sent_again_under_its_key_or_ends_unknown() {
    use escher_proto::replicas::{LEADER_METADATA, MAY_STILL_COMMIT, OUTCOME_METADATA};
    let mut head = FakeHead::start(HEARTBEAT).await;
    let in_doubt = |url: &str| {
        let mut status = Status::unavailable("this head replica is not the leader");
        status
            .metadata_mut()
            .insert(LEADER_METADATA, url.parse().unwrap());
        status
            .metadata_mut()
            .insert(OUTCOME_METADATA, MAY_STILL_COMMIT.parse().unwrap());
        status
    };
    let builder = worker(&head).function("claim", |ctx, _args| async move {
        let name = "slot".try_into().map_err(|e| format!("{e}"))?;
        let op = CapacityOp::Set(Capacity::Finite(
            Amount::units(2).map_err(|e| e.to_string())?,
        ));
        match ctx.set_resource(name, op).await {
            Ok(outcome) => Ok(format!("{:?}", outcome.nodes).into_bytes()),
            Err(e) => Err(e.to_string()),
        }
    });
    let w = RunningWorker::start(builder);
    attached(&mut head).await;

    // In doubt, then served: sent again (the same request, under its key), and it succeeds.
    head.fail_set_resources([in_doubt(&head.url())]);
    head.send(assign(5, function("claim", vec![])));
    started(&mut head, 5).await;
    let (first, _) = head.set_resources_call().await;
    let (again, _) = head.set_resources_call().await;
    assert_eq!(first, again, "the same write again");
    let done = finished(&mut head, 5).await;
    assert_eq!(
        done.outcome,
        Ok(TaskResult::Returned(
            format!("{:?}", vec![NodeId(1)]).into_bytes().into()
        ))
    );

    // In doubt, then a deadline: the outcome is unknown, and the error says so.
    head.fail_set_resources([
        in_doubt(&head.url()),
        Status::deadline_exceeded("the head took too long"),
    ]);
    head.send(assign(6, function("claim", vec![])));
    started(&mut head, 6).await;
    head.set_resources_call().await;
    head.set_resources_call().await;
    let done = finished(&mut head, 6).await;
    let why = done.outcome.unwrap_err();
    assert!(
        why.contains("set_resources: the outcome is unknown") && why.contains("may still commit"),
        "{why}"
    );
    w.stop().await.unwrap();
}

#[tokio::test]
async fn ghosts_end_after_their_ttl_or_when_cancelled() {
    let mut head = FakeHead::start(HEARTBEAT).await;
    let w = RunningWorker::start(worker(&head));
    attached(&mut head).await;

    let t = Instant::now();
    let done = run(&mut head, 1, ghost(Some(Duration::from_millis(200)))).await;
    assert!(
        t.elapsed() >= Duration::from_millis(200),
        "{:?}",
        t.elapsed()
    );
    assert_eq!(done.outcome, Ok(TaskResult::Released));

    head.send(assign(2, ghost(None)));
    started(&mut head, 2).await;
    assert_eq!(head.quiet_for(Duration::from_millis(300)).await, None);
    head.send(cancel(2));
    let done = finished(&mut head, 2).await;
    assert_eq!(done.outcome, Ok(TaskResult::Released));
    assert!(!done.timed_out);
    w.stop().await.unwrap();
}

#[tokio::test]
async fn a_batch_is_handled_in_order_and_reports_go_back_in_batches() {
    let mut head = FakeHead::start(HEARTBEAT).await;
    let w = RunningWorker::start(worker(&head));
    attached(&mut head).await;
    // One batch: two ghosts, then a cancellation of the first. In order, the cancellation
    // finds the first ghost running.
    head.send_batch(vec![
        assign(1, ghost(None)),
        assign(2, ghost(None)),
        cancel(1),
    ]);
    // Both start; the first's end may come before the second's start is reported (a start
    // waits a little, to go with an end that comes soon), never before its own start.
    let mut reports = Vec::new();
    for _ in 0..3 {
        reports.push(head.report().await);
    }
    let at = |want: &dyn Fn(&WorkerMessage) -> bool| reports.iter().position(want);
    let started_1 =
        at(&|m| matches!(m, WorkerMessage::TaskStarted { task_id, .. } if task_id.0 == 1));
    let started_2 =
        at(&|m| matches!(m, WorkerMessage::TaskStarted { task_id, .. } if task_id.0 == 2));
    let finished_1 = at(&|m| matches!(m, WorkerMessage::TaskFinished(f) if f.task_id.0 == 1));
    assert!(started_2.is_some(), "{reports:?}");
    assert!(started_1.is_some() && started_1 < finished_1, "{reports:?}");
    let Some(WorkerMessage::TaskFinished(done)) = finished_1.map(|i| &reports[i]) else {
        panic!("{reports:?}");
    };
    assert_eq!(done.outcome, Ok(TaskResult::Released));
    // Hundreds of assignments in one batch are started in one turn of the worker's loop: their
    // reports leave together, not one message per batch.
    head.send_batch((10..500).map(|task| assign(task, ghost(None))).collect());
    let mut started = 0;
    while started < 490 {
        if let WorkerMessage::TaskStarted { task_id, .. } = head.report().await
            && task_id.0 >= 10
        {
            started += 1;
        }
    }
    assert!(head.largest_batch() > 1, "{}", head.largest_batch());
    w.stop().await.unwrap();
}

#[tokio::test]
async fn thousands_of_ghosts_are_cheap() {
    const N: u64 = 2000;
    let mut head = FakeHead::start(HEARTBEAT).await;
    let w = RunningWorker::start(worker(&head));
    attached(&mut head).await;
    for task in 0..N {
        head.send(assign(task, ghost(Some(Duration::from_millis(100)))));
    }
    let (mut started, mut released) = (0, 0);
    while released < N {
        match head.report().await {
            WorkerMessage::TaskStarted { .. } => started += 1,
            WorkerMessage::TaskFinished(f) => {
                assert_eq!(f.outcome, Ok(TaskResult::Released));
                released += 1;
            }
            other => panic!("{other:?}"),
        }
    }
    assert_eq!(started, N);
    w.stop().await.unwrap();
}

#[tokio::test]
async fn an_invalid_assignment_is_reported_as_failed() {
    let mut head = FakeHead::start(HEARTBEAT).await;
    let w = RunningWorker::start(worker(&head));
    attached(&mut head).await;
    head.send_wire(wire::HeadMessage {
        body: Some(wire::head_message::Body::Assign(wire::Assign {
            task_id: 9,
            attempt: 1,
            spec: None,
            allocation: vec![],
            task_token: String::new(),
            ..Default::default()
        })),
    });
    let done = finished(&mut head, 9).await;
    assert_eq!(
        done.outcome,
        Err("invalid assignment: missing field assign.spec".to_string())
    );
    // Messages it cannot read at all are ignored; the worker goes on.
    head.send_wire(wire::HeadMessage { body: None });
    let ok = run(&mut head, 10, sh("true")).await;
    assert_eq!(ok.outcome, Ok(TaskResult::Exited { code: 0 }));
    w.stop().await.unwrap();
}
