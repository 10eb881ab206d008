//! The link between a worker and a fake head: registration, heartbeats, re-registration after
//! the stream breaks (same node id, new node id, head unavailable for a while), refusal, and
//! shutdown (the caller's, and the head's), and an assignment read after the lease ran out.

mod support;

use std::time::Duration;

use escher_proto::types::{Assignment, HeadMessage, RunningTask, WorkerMessage};
use escher_proto::{LogStream, NodeId, ResourceSet, TaskId, TaskKind, TaskResult, TaskSpec};
use escher_worker::WorkerError;
use support::{FakeHead, RunningWorker, attached, bounded, sh, spec, worker};
use tokio::net::TcpListener;

const HEARTBEAT: Duration = Duration::from_millis(100);

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

/// Waits until the worker has taken every message the head sent before this call: it handles
/// the head's messages one at a time, in order, and answers a log fetch, so once the answer
/// to a fetch sent now arrives, what came before it has been applied. (A wait on an event
/// where a fixed sleep used to hope the worker had got there.)
async fn taken(head: &mut FakeHead) {
    const PROBE: u64 = u64::MAX;
    head.send(HeadMessage::FetchLogs {
        request_id: PROBE,
        task_id: TaskId(999_999),
        stream: LogStream::Stdout,
        offset: 0,
        max_bytes: 1,
        attempt: 1,
    });
    loop {
        if let WorkerMessage::Logs { request_id, .. } = head.report().await
            && request_id == PROBE
        {
            return;
        }
    }
}

fn ghost(ttl: Option<Duration>) -> TaskSpec {
    spec(TaskKind::Ghost {
        creates: vec![],
        ttl,
    })
}

fn running(tasks: &[u64]) -> Vec<RunningTask> {
    tasks
        .iter()
        .map(|&t| RunningTask {
            task_id: TaskId(t),
            attempt: 1,
        })
        .collect()
}

async fn expect_started(head: &mut FakeHead, task: u64) {
    match head.report().await {
        WorkerMessage::TaskStarted { task_id, .. } => assert_eq!(task_id, TaskId(task)),
        other => panic!("expected TaskStarted for {task}, got {other:?}"),
    }
}

async fn expect_finished(head: &mut FakeHead, task: u64) -> Result<TaskResult, String> {
    match head.report().await {
        WorkerMessage::TaskFinished(f) => {
            assert_eq!(f.task_id, TaskId(task), "{f:?}");
            f.outcome
        }
        other => panic!("expected TaskFinished for {task}, got {other:?}"),
    }
}

#[tokio::test]
async fn registers_resources_and_labels_then_says_hello() {
    let mut head = FakeHead::start(HEARTBEAT).await;
    let builder = worker(&head)
        .resources("custom=3,memory=2048".parse().unwrap())
        .labels("zone=a".parse().unwrap());
    let w = RunningWorker::start(builder);
    let mut handle = w.handle.clone();
    let (reg, node) = attached(&mut head).await;
    assert_eq!(reg.name, "test-worker");
    assert!(!reg.address.is_empty());
    let cpus = std::thread::available_parallelism().unwrap().get();
    assert_eq!(reg.resources.get("cpu").to_string(), cpus.to_string());
    assert_eq!(reg.resources.get("memory").to_string(), "2048");
    assert_eq!(reg.resources.get("custom").to_string(), "3");
    assert_eq!(reg.labels.get("zone"), Some("a"));
    assert!(reg.identity.is_none());
    assert_ne!(reg.boot_id, 0);
    assert!(reg.running.is_empty());
    assert_eq!(bounded("registered", handle.registered()).await, Some(node));
    assert_eq!(w.handle.node_id(), Some(node));
    w.stop().await.unwrap();
}

#[tokio::test]
async fn sends_heartbeats_at_the_interval_the_head_asked_for() {
    let mut head = FakeHead::start(HEARTBEAT).await;
    let w = RunningWorker::start(worker(&head));
    attached(&mut head).await;
    for _ in 0..3 {
        match head.message().await {
            (1, WorkerMessage::Heartbeat { metrics, fence, .. }) => {
                let running = metrics.iter().find(|m| m.name == "running_tasks");
                assert_eq!(running.map(|m| m.value), Some(0.0));
                // A worker embedded in this test has no fence supervisor, and says so.
                let fence = fence.unwrap_or_default();
                assert!(
                    fence.starts_with("none: this worker runs inside another program"),
                    "{fence}"
                );
            }
            other => panic!("expected a heartbeat, got {other:?}"),
        }
    }
    w.stop().await.unwrap();

    // The interval is the head's, not the worker's own: over the same window a worker asked
    // for one every 400 ms sends at most what that allows (a timer never fires early; one
    // more for the first tick, one for the window's edge), and one asked for one every 50 ms
    // sends several times that (48 expected; 10 leaves room for a loaded machine).
    let window = Duration::from_millis(2_400);
    let mut counts = Vec::new();
    for asked in [Duration::from_millis(400), Duration::from_millis(50)] {
        let mut head = FakeHead::start(asked).await;
        let w = RunningWorker::start(worker(&head));
        attached(&mut head).await;
        counts.push(head.heartbeats_within(window).await);
        w.stop().await.unwrap();
    }
    let allowed = (window.as_millis() / 400) as usize + 2;
    assert!(
        (1..=allowed).contains(&counts[0]),
        "asked for one every 400 ms, the worker sent {} in {window:?} (at most {allowed})",
        counts[0]
    );
    assert!(
        counts[1] >= 10 && counts[1] > counts[0],
        "asked for one every 50 ms, the worker sent {} in {window:?} (400 ms: {})",
        counts[1],
        counts[0]
    );
}

#[tokio::test]
async fn re_registers_with_its_node_id_and_running_tasks_after_the_stream_breaks() {
    let mut head = FakeHead::start(HEARTBEAT).await;
    let w = RunningWorker::start(worker(&head));
    let (_, node) = attached(&mut head).await;
    head.send(assign(1, ghost(None)));
    expect_started(&mut head, 1).await;

    head.drop_stream();
    let (reg, again) = attached(&mut head).await;
    let identity = reg.identity.clone().expect("it presents its identity");
    assert_eq!(
        (identity.node_id, identity.secret.as_str()),
        (node, "secret-1")
    );
    assert_eq!(reg.running, running(&[1]));
    assert_eq!(again, node);

    // Same node id: the task goes on and is reported on the new stream.
    head.send(HeadMessage::CancelTask {
        task_id: TaskId(1),
        attempt: 1,
        reason: "test".into(),
        force: false,
    });
    assert_eq!(
        expect_finished(&mut head, 1).await,
        Ok(TaskResult::Released)
    );
    w.stop().await.unwrap();
}

#[tokio::test]
async fn keeps_each_report_until_the_head_acknowledges_it() {
    let mut head = FakeHead::start(HEARTBEAT).await;
    let w = RunningWorker::start(worker(&head));
    attached(&mut head).await;
    head.send(assign(1, ghost(Some(Duration::from_millis(50)))));
    expect_started(&mut head, 1).await;
    assert_eq!(
        expect_finished(&mut head, 1).await,
        Ok(TaskResult::Released)
    );
    head.send(assign(2, ghost(Some(Duration::from_millis(50)))));
    expect_started(&mut head, 2).await;
    assert_eq!(
        expect_finished(&mut head, 2).await,
        Ok(TaskResult::Released)
    );
    // The head commits task 2's report only; the stream breaks before task 1's is.
    head.send(HeadMessage::ReportsAcked(running(&[2])));
    taken(&mut head).await;
    head.drop_stream();
    let (reg, _) = attached(&mut head).await;
    let reported: Vec<TaskId> = reg.finished.iter().map(|f| f.task_id).collect();
    assert_eq!(
        reported,
        [TaskId(1)],
        "only the unacknowledged report comes again"
    );
    // The registration acknowledged it: the next one carries none.
    head.drop_stream();
    let (reg, _) = attached(&mut head).await;
    assert!(reg.finished.is_empty(), "{:?}", reg.finished);
    // An attempt this process ran is not run twice.
    head.send(assign(1, ghost(None)));
    assert_eq!(head.quiet_for(Duration::from_millis(300)).await, None);
    w.stop().await.unwrap();
}

#[tokio::test]
async fn reports_what_finished_while_the_head_was_away() {
    let mut head = FakeHead::start(HEARTBEAT).await;
    let w = RunningWorker::start(worker(&head));
    let (_, node) = attached(&mut head).await;
    head.send(assign(1, ghost(Some(Duration::from_millis(300)))));
    expect_started(&mut head, 1).await;

    head.unavailable(true);
    head.drop_stream();
    // The ghost ends while the head refuses registrations.
    tokio::time::sleep(Duration::from_millis(600)).await;
    head.unavailable(false);
    let (reg, again) = attached(&mut head).await;
    assert_eq!(again, node);
    assert!(reg.running.is_empty(), "{:?}", reg.running);
    // The report travels with the registration, which acknowledges it.
    assert_eq!(reg.finished.len(), 1, "{:?}", reg.finished);
    assert_eq!(reg.finished[0].task_id, TaskId(1));
    assert_eq!(reg.finished[0].outcome, Ok(TaskResult::Released));
    w.stop().await.unwrap();
}

#[tokio::test]
async fn an_unknown_identity_cancels_the_old_tasks_and_joins_as_a_new_node() {
    let mut head = FakeHead::start(HEARTBEAT).await;
    head.keep_ids(false);
    let w = RunningWorker::start(worker(&head));
    let (_, node) = attached(&mut head).await;
    head.send(assign(5, sh("echo $$; exec sleep 30")));
    expect_started(&mut head, 5).await;
    let pid = bounded("the command's pid", async {
        loop {
            let out = std::fs::read_to_string(w.log_dir.join("5-1.out")).unwrap_or_default();
            if let Some(line) = out.lines().next() {
                return line.trim().to_string();
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    })
    .await;

    head.drop_stream();
    // It presents its identity with the running task, is told the head does not know it...
    let refused = head.registration().await;
    assert_eq!(refused.identity.map(|i| i.node_id), Some(node));
    assert_eq!(refused.running, running(&[5]));
    // ...and registers as a new node, with nothing running.
    let (reg, new_node) = attached(&mut head).await;
    assert!(reg.identity.is_none());
    assert_ne!(new_node, node);
    assert_eq!(head.quiet_for(Duration::from_millis(700)).await, None);
    assert_eq!(w.handle.node_id(), Some(new_node));
    bounded("the old command to be killed", async {
        while std::path::Path::new(&format!("/proc/{pid}")).exists() {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    })
    .await;

    // The old task is forgotten: the next registration does not list it.
    head.drop_stream();
    head.keep_ids(true);
    let (reg, _) = attached(&mut head).await;
    assert_eq!(reg.identity.map(|i| i.node_id), Some(new_node));
    assert!(reg.running.is_empty(), "{:?}", reg.running);
    w.stop().await.unwrap();
}

#[tokio::test]
async fn waits_for_a_head_that_is_not_up_yet() {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    drop(listener);
    let url = format!("http://{addr}");
    let w = RunningWorker::start(
        escher_worker::Worker::builder()
            .head(url)
            .name("early")
            .drain(Duration::ZERO)
            .reconnect_backoff(Duration::from_millis(20), Duration::from_millis(100)),
    );
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(w.handle.node_id(), None);
    let listener = TcpListener::bind(addr).await.unwrap();
    let mut head = FakeHead::serve(listener, HEARTBEAT);
    let (reg, node) = attached(&mut head).await;
    assert_eq!(reg.name, "early");
    assert_eq!(node, NodeId(1));
    w.stop().await.unwrap();
}

#[tokio::test]
async fn a_refused_worker_stops_with_an_error() {
    let head = FakeHead::start(HEARTBEAT).await;
    head.reject();
    let w = RunningWorker::start(worker(&head));
    let err = w.join().await.unwrap_err();
    assert!(matches!(err, WorkerError::Rejected { .. }), "{err}");
    assert!(err.to_string().contains("refuses workers"), "{err}");
}

#[tokio::test]
async fn shutdown_cancels_and_reports_running_tasks_then_closes_the_stream() {
    let mut head = FakeHead::start(HEARTBEAT).await;
    let w = RunningWorker::start(worker(&head));
    attached(&mut head).await;
    head.send(assign(1, ghost(None)));
    head.send(assign(2, sh("exec sleep 30")));
    expect_started(&mut head, 1).await;
    expect_started(&mut head, 2).await;
    w.stop().await.unwrap();
    let mut outcomes = Vec::new();
    while let Some(msg) = head.quiet_for(Duration::from_millis(500)).await {
        if let WorkerMessage::TaskFinished(f) = msg {
            outcomes.push((f.task_id, f.outcome));
        }
    }
    outcomes.sort_by_key(|(t, _)| *t);
    assert_eq!(
        outcomes,
        vec![
            (TaskId(1), Ok(TaskResult::Released)),
            (TaskId(2), Ok(TaskResult::Exited { code: 143 })),
        ]
    );
}

#[tokio::test]
async fn draining_lets_tasks_finish_and_refuses_new_ones() {
    let mut head = FakeHead::start(HEARTBEAT).await;
    let w = RunningWorker::start(worker(&head).drain(Duration::from_secs(5)));
    attached(&mut head).await;
    head.send(assign(1, ghost(Some(Duration::from_millis(400)))));
    expect_started(&mut head, 1).await;
    let stopped = tokio::spawn(w.stop());
    // The worker says it is draining.
    bounded("a draining heartbeat", async {
        loop {
            if let (_, WorkerMessage::Heartbeat { metrics, .. }) = head.message().await
                && metrics
                    .iter()
                    .any(|m| m.name == "draining" && m.value == 1.0)
            {
                return;
            }
        }
    })
    .await;
    head.send(assign(2, ghost(None)));
    let refused = expect_finished(&mut head, 2).await.unwrap_err();
    assert!(refused.contains("shutting down"), "{refused}");
    assert_eq!(
        expect_finished(&mut head, 1).await,
        Ok(TaskResult::Released)
    );
    bounded("the worker to stop", stopped)
        .await
        .unwrap()
        .unwrap();
}

#[tokio::test]
async fn the_head_can_tell_a_worker_to_stop() {
    let mut head = FakeHead::start(HEARTBEAT).await;
    let w = RunningWorker::start(worker(&head));
    attached(&mut head).await;
    head.send(HeadMessage::Shutdown {
        reason: "test".into(),
    });
    w.join().await.unwrap();
}

/// A head whose state was restored from a backup says so at registration (a new
/// incarnation): the restored head numbers attempts from what the backup knew and never sends
/// again one that ran after the backup, so the worker forgets which attempts it ran. The same
/// head reached again does not make it forget.
#[tokio::test]
async fn a_head_restored_from_a_backup_may_send_an_attempt_this_process_ran_after_it() {
    let mut head = FakeHead::start(HEARTBEAT).await;
    let w = RunningWorker::start(worker(&head));
    attached(&mut head).await;
    head.send(assign(1, ghost(Some(Duration::from_millis(50)))));
    expect_started(&mut head, 1).await;
    assert_eq!(
        expect_finished(&mut head, 1).await,
        Ok(TaskResult::Released)
    );
    head.send(HeadMessage::ReportsAcked(running(&[1])));
    taken(&mut head).await;
    // The same head again: attempt 1 of task 1 ran in this process; it does not run twice.
    head.drop_stream();
    attached(&mut head).await;
    head.send(assign(1, ghost(None)));
    assert_eq!(head.quiet_for(Duration::from_millis(300)).await, None);
    // Restored from a backup taken before it ran: the restored head's attempt 1 runs.
    head.restored(1_600_000_001);
    head.drop_stream();
    attached(&mut head).await;
    head.send(assign(1, ghost(Some(Duration::from_millis(50)))));
    expect_started(&mut head, 1).await;
    assert_eq!(
        expect_finished(&mut head, 1).await,
        Ok(TaskResult::Released)
    );
    w.stop().await.unwrap();
}

/// A worker that reads an assignment after its lease ran out (it was stopped, or cut off, and
/// its heartbeat has not yet noticed) refuses it unstarted: the head may have given that
/// attempt up and sent the next one elsewhere. (The double run the history checker found in 1
/// of 12 pause-worker faults.)
#[tokio::test]
async fn an_assignment_read_after_the_lease_ran_out_is_refused_not_started() {
    // Heartbeats every 10 s: the worker's own check of its lease, on each heartbeat, does not
    // come before the assignment does.
    let mut head = FakeHead::start(Duration::from_secs(10)).await;
    // A lease of 500 ms, which this head never renews.
    head.grant_lease(Duration::from_millis(500));
    let w = RunningWorker::start(worker(&head));
    attached(&mut head).await;
    tokio::time::sleep(Duration::from_millis(600)).await;
    let marker = tempfile::tempdir().unwrap();
    let ran = marker.path().join("ran");
    head.send(assign(1, sh(&format!("touch {}", ran.display()))));
    let refused = expect_finished(&mut head, 1)
        .await
        .expect_err("an assignment read after the lease ran out is refused");
    assert!(
        refused.contains("after its lease had run out") && refused.contains("not started"),
        "{refused}"
    );
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert!(!ran.exists(), "the refused task ran");
    w.stop().await.unwrap();
}
