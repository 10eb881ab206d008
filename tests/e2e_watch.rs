//! The watch API end to end (docs/DESIGN.md §11), with a real `escher-head` and real
//! `escher-worker` processes on loopback: a scripted scenario (submit, start, finish, a resource
//! change, a node joining and being lost) arrives in order with revisions counting up by one; a
//! second watch resumes after a revision and gets exactly what followed; the futures built on it
//! (`Client::started`, `Client::finished`) answer; and a watcher that stops reading is cut off
//! while submits go on, counted rather than timed.

mod procs;

use escher::types::{
    ClusterEvent, NodeChange, NodeSpec, TaskId, TaskState, WatchEvent, WatchKind, WatchRequest,
};
use escher::{ClientError, Task, Watch};
use escher_proto::wire;
use procs::{ProcessCluster, WAIT};

/// The next event of `watch`, within [`WAIT`].
async fn next(watch: &mut Watch) -> WatchEvent {
    tokio::time::timeout(WAIT, watch.next())
        .await
        .expect("an event in time")
        .expect("the watch goes on")
        .expect("an event, not an error")
}

/// Events of `watch` until one satisfies `done`; all of them, that one included.
async fn until(watch: &mut Watch, done: impl Fn(&ClusterEvent) -> bool) -> Vec<WatchEvent> {
    let mut seen = Vec::new();
    loop {
        let event = next(watch).await;
        let stop = done(&event.event);
        seen.push(event);
        if stop {
            return seen;
        }
    }
}

fn position(events: &[WatchEvent], what: impl Fn(&ClusterEvent) -> bool) -> usize {
    events
        .iter()
        .position(|e| what(&e.event))
        .unwrap_or_else(|| panic!("missing event in {events:#?}"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_scripted_scenario_arrives_in_order_and_resumes_from_a_revision() {
    let mut cluster = ProcessCluster::builder()
        .heartbeat_timeout_ms(1_500)
        .start()
        .await;
    let client = cluster.client().await;
    let w1 = cluster.node("w1");
    let mut watch = client.watch(WatchRequest::all()).await.unwrap();
    let start = watch.revision();

    let task = client.submit(Task::command(["true"])).await.unwrap();
    client
        .set_resource("dataset-7", 3, NodeSpec::Node(w1))
        .await
        .unwrap();
    let w2 = cluster.start_worker("w2", "cpu=1,memory=64").await;
    cluster.kill_worker("w2");
    let id = task.id();
    let mut events = until(
        &mut watch,
        |e| matches!(e, ClusterEvent::Node { node, change: NodeChange::Lost, .. } if *node == w2),
    )
    .await;
    // The task may finish after the node is lost: read on until it did.
    if !events
        .iter()
        .any(|e| matches!(e.event, ClusterEvent::Finished { task, .. } if task == id))
    {
        events.extend(
            until(
                &mut watch,
                |e| matches!(e, ClusterEvent::Finished { task, .. } if *task == id),
            )
            .await,
        );
    }

    // Every event the cluster recorded, none skipped, in revision order.
    for (i, event) in events.iter().enumerate() {
        assert_eq!(event.revision, start + 1 + i as u64, "{events:#?}");
    }
    let submitted = position(
        &events,
        |e| matches!(e, ClusterEvent::Submitted { task, .. } if *task == id),
    );
    let started = position(
        &events,
        |e| matches!(e, ClusterEvent::Started { task, node, attempt: 1, .. } if *task == id && *node == w1),
    );
    let finished = position(
        &events,
        |e| matches!(e, ClusterEvent::Finished { task, state: TaskState::Succeeded, .. } if *task == id),
    );
    assert!(submitted < started && started < finished, "{events:#?}");
    let resized = position(
        &events,
        |e| matches!(e, ClusterEvent::Resource { node, name, capacity: Some(_) } if *node == w1 && name.as_str() == "dataset-7"),
    );
    let joined = position(
        &events,
        |e| matches!(e, ClusterEvent::Node { node, change: NodeChange::Joined, name, .. } if *node == w2 && name == "w2"),
    );
    let lost = position(
        &events,
        |e| matches!(e, ClusterEvent::Node { node, change: NodeChange::Lost, reason: Some(_), .. } if *node == w2),
    );
    assert!(
        submitted < resized && resized < joined && joined < lost,
        "{events:#?}"
    );

    // Resuming after the submit gets exactly what followed it.
    let after = events[submitted].revision;
    let mut resumed = client
        .watch(WatchRequest::all().after(after))
        .await
        .unwrap();
    for expected in &events[submitted + 1..] {
        assert_eq!(&next(&mut resumed).await, expected);
    }

    // Filters: this task's finish only.
    let only = WatchRequest::tasks([id])
        .kinds([WatchKind::Finished])
        .after(start);
    let mut filtered = client.watch(only).await.unwrap();
    assert_eq!(next(&mut filtered).await, events[finished]);

    // The futures: a finished task answers at once; a new one when it starts and ends.
    assert_eq!(client.finished(id).await.unwrap().0, TaskState::Succeeded);
    let sleeper = client
        .submit(Task::command(["sleep", "0.3"]))
        .await
        .unwrap();
    let (node, attempt) = client.started(sleeper.id()).await.unwrap();
    assert_eq!((node, attempt), (w1, 1));
    let (state, reason) = client.finished(sleeper.id()).await.unwrap();
    assert_eq!((state, reason), (TaskState::Succeeded, None));
    let failing = client.submit(Task::command(["false"])).await.unwrap();
    let (state, reason) = client.finished(failing.id()).await.unwrap();
    assert_eq!(state, TaskState::Failed);
    assert!(reason.unwrap().contains("exited with code 1"));
    let never = client
        .submit(Task::command(["true"]).resources_str("cpu=64"))
        .await
        .unwrap();
    client.cancel([never.id()]).await.unwrap();
    let err = client.started(never.id()).await.unwrap_err();
    assert!(err.to_string().contains("never started"), "{err}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stalled_watcher_is_cut_off_and_submits_go_on() {
    // A small buffer and history, so that the test needs few events.
    let cluster = ProcessCluster::builder()
        .head_args(&["--watch-buffer", "64", "--watch-history", "5000"])
        .start()
        .await;
    let client = cluster.client().await;
    // A raw stream that is never read: the head must not wait for it.
    let channel = tonic::transport::Endpoint::from_shared(cluster.head_url().to_string())
        .unwrap()
        .connect()
        .await
        .unwrap();
    let bearer = cluster.credentials().bearer();
    let mut raw = wire::cluster_client::ClusterClient::with_interceptor(channel, bearer);
    let mut stalled = raw
        .watch(wire::WatchRequest::default())
        .await
        .unwrap()
        .into_inner();

    // Tasks no node can run: each is submitted, blocked, then cancelled (three events), and
    // the head runs nothing.
    const BATCHES: usize = 30;
    const PER_BATCH: usize = 100;
    const TOTAL: usize = BATCHES * PER_BATCH;
    // A watcher that keeps reading counts the ends, resuming by itself if the head cuts it
    // off (its history covers that).
    let mut reading = client
        .watch(WatchRequest::all().kinds([WatchKind::Finished]))
        .await
        .unwrap();
    let counter = tokio::spawn(async move {
        let mut finished = 0;
        while finished < TOTAL {
            if let ClusterEvent::Finished { .. } = next(&mut reading).await.event {
                finished += 1;
            }
        }
        finished
    });
    let mut ids: Vec<TaskId> = Vec::new();
    for _ in 0..BATCHES {
        let batch = (0..PER_BATCH).map(|_| Task::command(["true"]).resources_str("cpu=64"));
        let refs = client
            .submit_batch(batch)
            .await
            .expect("submits are not slowed");
        let these: Vec<TaskId> = refs.iter().map(|r| r.id()).collect();
        client.cancel(these.clone()).await.unwrap();
        ids.extend(these);
    }
    assert_eq!(ids.len(), TOTAL, "every submit was accepted");
    assert_eq!(
        counter.await.unwrap(),
        TOTAL,
        "the reading watcher saw every end"
    );

    // The stalled stream holds what fit in its buffers, then the reason it was cut off.
    let mut got = 0usize;
    let status = loop {
        match tokio::time::timeout(WAIT, stalled.message())
            .await
            .expect("in time")
        {
            Ok(Some(batch)) => got += batch.events.len(),
            Ok(None) => panic!("the stream ended without saying why after {got} events"),
            Err(status) => break status,
        }
    };
    assert_eq!(status.code(), tonic::Code::ResourceExhausted, "{status:?}");
    assert!(
        status.message().contains("fell 64 events behind"),
        "{status:?}"
    );
    assert!(got < 3 * TOTAL, "{got} events reached the stalled watcher");

    // History is bounded too: resuming from the start is refused with what to do.
    let err = client
        .watch(WatchRequest::all().after(1))
        .await
        .unwrap_err();
    assert!(
        matches!(&err, ClientError::HistoryExpired(m) if m.contains("list the current state")),
        "{err}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_watch_survives_a_leader_change_with_nothing_lost() {
    let mut cluster = ProcessCluster::builder()
        .heads(3)
        .heartbeat_timeout_ms(20_000)
        .start()
        .await;
    let leader = cluster.wait_leader().await;
    let client = cluster.client().await;
    let mut watch = client
        .watch(WatchRequest::all().kinds([WatchKind::Submitted]))
        .await
        .unwrap();
    let before = client.submit(Task::command(["true"])).await.unwrap();
    let first = next(&mut watch).await;
    assert!(matches!(first.event, ClusterEvent::Submitted { task, .. } if task == before.id()));

    // The leader dies: the watch resumes on the next one, after the revision it delivered.
    cluster.kill_head_at(leader);
    let after = client.submit(Task::command(["true"])).await.unwrap();
    let second = next(&mut watch).await;
    assert!(
        matches!(second.event, ClusterEvent::Submitted { task, .. } if task == after.id()),
        "{second:?}"
    );
    assert!(second.revision > first.revision);
    assert_eq!(watch.revision(), second.revision);
}
