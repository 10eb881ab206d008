//! End-to-end tests of the replicated, durable head with real processes on loopback
//! (`procs/mod.rs`): durability across SIGKILLs of a durable head, failover of a three-replica
//! group whose leader is SIGKILLed under load, a partition that isolates the leader (through
//! proxies the test owns) followed by a whole-group restart from disk, and idempotent retries
//! of writes whose replies were dropped.
//!
//! What the tests count on: a write is *acknowledged* when its call returned `Ok`. Every
//! acknowledged task must reach a terminal state exactly once and every acknowledged `+1` must
//! be in the counter resource; a write whose call failed may or may not have been applied (its
//! reply was lost with the head), so counts are checked between "acknowledged" and
//! "attempted". Command tasks append `TASK ATTEMPT NODE` to one shared file, so a task that ran
//! twice would show. Failover times are printed (the figures are measured by W10 in
//! `escher-bench`), and only bounded generously here. A head stopped gracefully (SIGTERM) leaves
//! its workers running: they wait for it, and their tasks finish once it is back.

mod procs;

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use escher::types::{NodeId, NodeSpec, TaskId, TaskState};
use escher::{Client, Task};
use procs::proxy::Proxy;
use procs::{ProcessCluster, WAIT, eventually};
use tokio::sync::Mutex;

/// The counter resource the `+1` writes adjust.
const COUNTER: &str = "e2e-counter";

/// A command task that appends `TASK ATTEMPT NODE` to `file`.
fn logged_task(file: &Path) -> Task {
    Task::command([
        "sh",
        "-c",
        r#"echo "$ESCHER_TASK_ID $ESCHER_ATTEMPT $ESCHER_NODE_ID" >> "$RUNS""#,
    ])
    .env("RUNS", file.display().to_string())
    .resources_str("cpu=0.1")
}

/// Every line of the run file: (task, attempt, node).
fn runs(file: &Path) -> Vec<(u64, u32, u64)> {
    std::fs::read_to_string(file)
        .unwrap_or_default()
        .lines()
        .map(|l| {
            let mut parts = l.split_whitespace().map(|p| p.parse::<u64>().unwrap());
            let (t, a, n) = (parts.next(), parts.next(), parts.next());
            (t.unwrap(), a.unwrap() as u32, n.unwrap())
        })
        .collect()
}

/// What the load generators saw.
#[derive(Debug, Default)]
struct Acked {
    tasks: Vec<TaskId>,
    deltas: u64,
    attempted_deltas: u64,
    /// When each write was acknowledged.
    times: Vec<Instant>,
}

/// Runs `clients` load generators against `url` until `stop`: each submits a logged task and
/// applies `+1` to the counter on `node`, and records what was acknowledged.
fn load(
    url: &str,
    credentials: &escher::Credentials,
    clients: usize,
    file: &Path,
    node: NodeId,
    stop: Arc<AtomicBool>,
) -> (Arc<Mutex<Acked>>, Vec<tokio::task::JoinHandle<()>>) {
    let acked = Arc::new(Mutex::new(Acked::default()));
    let handles = (0..clients)
        .map(|_| {
            let credentials = credentials.clone();
            let (url, file, stop, acked) = (
                url.to_string(),
                file.to_path_buf(),
                Arc::clone(&stop),
                Arc::clone(&acked),
            );
            tokio::spawn(async move {
                let client = Client::connect_lazy(&url)
                    .unwrap()
                    .with_credentials(credentials.clone())
                    .with_failover_timeout(Duration::from_secs(30));
                while !stop.load(Ordering::SeqCst) {
                    if let Ok(task) = client.submit(logged_task(&file)).await {
                        let mut a = acked.lock().await;
                        a.tasks.push(task.id());
                        a.times.push(Instant::now());
                    }
                    acked.lock().await.attempted_deltas += 1;
                    let delta = client.adjust_resource(COUNTER, 1, NodeSpec::Node(node));
                    if delta.await.is_ok() {
                        let mut a = acked.lock().await;
                        a.deltas += 1;
                        a.times.push(Instant::now());
                    }
                }
            })
        })
        .collect();
    (acked, handles)
}

/// The counter's capacity now, in whole units (0 if absent).
async fn counter(client: &Client, node: NodeId) -> u64 {
    let status = client.cluster_status().await.expect("cluster status");
    status
        .node(node)
        .and_then(|n| n.resource(COUNTER))
        .map_or(0, |r| {
            r.total.to_string().parse::<f64>().unwrap_or(0.0) as u64
        })
}

/// Waits until every task is terminal; returns the statuses.
async fn all_terminal(client: &Client, ids: &[TaskId]) -> BTreeMap<TaskId, TaskState> {
    let mut out = BTreeMap::new();
    for chunk in ids.chunks(500) {
        let (ready, not_ready) = client
            .wait(chunk.iter().copied(), chunk.len(), Some(WAIT))
            .await
            .expect("wait");
        assert!(not_ready.is_empty(), "not finished: {not_ready:?}");
        out.extend(ready.into_iter().map(|s| (s.id, s.state)));
    }
    out
}

/// Every acknowledged task succeeded and ran exactly once, on attempt 1.
fn ran_once_each(file: &Path, statuses: &BTreeMap<TaskId, TaskState>) {
    let runs = runs(file);
    let mut seen: BTreeMap<u64, Vec<(u32, u64)>> = BTreeMap::new();
    for (t, a, n) in runs {
        seen.entry(t).or_default().push((a, n));
    }
    for (id, state) in statuses {
        assert_eq!(*state, TaskState::Succeeded, "task {id}");
        let lines = seen.get(&id.0).cloned().unwrap_or_default();
        assert_eq!(
            lines.len(),
            1,
            "task {id} ran {} times: {lines:?}",
            lines.len()
        );
    }
    for (t, lines) in &seen {
        let attempts: BTreeSet<u32> = lines.iter().map(|(a, _)| *a).collect();
        assert_eq!(
            attempts.len(),
            lines.len(),
            "task {t} ran an attempt twice: {lines:?}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_durable_head_killed_at_random_points_keeps_everything_acknowledged() {
    let mut cluster = ProcessCluster::builder()
        .durable()
        .workers(3)
        .heartbeat_timeout_ms(20_000)
        .start()
        .await;
    let nodes: Vec<NodeId> = ["w1", "w2", "w3"].iter().map(|w| cluster.node(w)).collect();
    let client = cluster.client().await;
    client
        .set_resource(COUNTER, 1, NodeSpec::Node(nodes[0]))
        .await
        .unwrap();
    let file = cluster.shared_path("runs.log");
    let mut all_tasks: Vec<TaskId> = Vec::new();
    let mut acked_deltas = 0;
    let mut attempted_deltas = 0;
    // A different point in each round, from a seed printed for a rerun.
    let seed = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(1, |d| d.subsec_nanos() as u64)
        ^ u64::from(std::process::id());
    eprintln!("kill points seeded with {seed}");
    let mut rng = seed | 1;
    for round in 0..3 {
        let stop = Arc::new(AtomicBool::new(false));
        let (acked, handles) = load(
            cluster.head_url(),
            &cluster.credentials(),
            3,
            &file,
            nodes[0],
            Arc::clone(&stop),
        );
        rng ^= rng << 13;
        rng ^= rng >> 7;
        rng ^= rng << 17;
        let pause = Duration::from_millis(200 + rng % 600);
        tokio::time::sleep(pause).await;
        cluster.kill_head();
        stop.store(true, Ordering::SeqCst);
        tokio::time::sleep(Duration::from_millis(100)).await;
        cluster.restart_head().await;
        for h in handles {
            h.await.unwrap();
        }
        let a = acked.lock().await;
        eprintln!(
            "round {round}: killed after {pause:?}; {} tasks and {} deltas acknowledged",
            a.tasks.len(),
            a.deltas
        );
        all_tasks.extend(&a.tasks);
        acked_deltas += a.deltas;
        attempted_deltas += a.attempted_deltas;
    }
    let client = cluster.client().await;
    let statuses = all_terminal(&client, &all_tasks).await;
    assert_eq!(statuses.len(), all_tasks.len());
    ran_once_each(&file, &statuses);
    let total = counter(&client, nodes[0]).await - 1;
    assert!(
        (acked_deltas..=attempted_deltas).contains(&total),
        "the counter ({total}) holds every acknowledged +1 ({acked_deltas}) and no more than \
         were attempted ({attempted_deltas})"
    );
    // Ids continue, and the workers kept their node ids.
    let next = client.submit(logged_task(&file)).await.unwrap();
    assert!(all_tasks.iter().all(|t| *t < next.id()), "ids continue");
    let status = client.cluster_status().await.unwrap();
    let live: Vec<NodeId> = status
        .nodes
        .iter()
        .filter(|n| n.alive)
        .map(|n| n.id)
        .collect();
    assert_eq!(
        live, nodes,
        "the same three nodes, no new ones: {status:#?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_three_replica_group_fails_over_under_load_and_loses_nothing() {
    let mut cluster = ProcessCluster::builder()
        .heads(3)
        .workers(2)
        .resources("cpu=4,memory=512")
        .heartbeat_timeout_ms(20_000)
        .start()
        .await;
    let leader = cluster.wait_leader().await;
    let node = cluster.node("w1");
    let client = cluster.client().await;
    client
        .set_resource(COUNTER, 1, NodeSpec::Node(node))
        .await
        .unwrap();
    let file = cluster.shared_path("runs.log");
    let stop = Arc::new(AtomicBool::new(false));
    let (acked, handles) = load(
        cluster.head_url(),
        &cluster.credentials(),
        4,
        &file,
        node,
        Arc::clone(&stop),
    );
    eventually("some writes to be acknowledged", WAIT, || {
        let acked = Arc::clone(&acked);
        async move { (acked.lock().await.deltas >= 20).then_some(()) }
    })
    .await;
    let killed_at = Instant::now();
    cluster.kill_head_at(leader);
    let first_after = eventually("a write acknowledged after the kill", WAIT, || {
        let acked = Arc::clone(&acked);
        async move {
            let a = acked.lock().await;
            a.times.iter().copied().find(|t| *t > killed_at)
        }
    })
    .await;
    let failover = first_after - killed_at;
    eprintln!("first write acknowledged {failover:?} after the leader was SIGKILLed");
    tokio::time::sleep(Duration::from_millis(500)).await;
    stop.store(true, Ordering::SeqCst);
    for h in handles {
        h.await.unwrap();
    }
    let new_leader = cluster.wait_leader().await;
    assert_ne!(new_leader, leader, "a new leader was elected");
    assert!(failover < WAIT, "failover took {failover:?}");

    let a = acked.lock().await;
    let statuses = all_terminal(&client, &a.tasks).await;
    assert_eq!(statuses.len(), a.tasks.len());
    ran_once_each(&file, &statuses);
    let total = counter(&client, node).await - 1;
    assert!(
        (a.deltas..=a.attempted_deltas).contains(&total),
        "the counter ({total}) holds every acknowledged +1 ({}) and no more than were \
         attempted ({})",
        a.deltas,
        a.attempted_deltas
    );
}

/// Leases (DESIGN §13): a failover shorter than a worker's lease stops nothing. The leader is
/// frozen (SIGSTOP: its connections stay open and silent, the worst case for a worker and a
/// client); the workers leave it for the new leader before their lease runs out, so every task
/// that was running finishes its first attempt; a client call made meanwhile is answered by
/// the new leader within a few seconds, not after TCP's timeouts.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failover_shorter_than_the_lease_stops_nothing() {
    let mut cluster = ProcessCluster::builder()
        .heads(3)
        .workers(2)
        .resources("cpu=4,memory=512")
        .heartbeat_timeout_ms(12_000)
        .start()
        .await;
    let leader = cluster.wait_leader().await;
    let client = cluster.client().await;
    let file = cluster.shared_path("runs.log");
    let sleeper = |secs: u32| {
        let script = format!(
            r#"echo "$ESCHER_TASK_ID $ESCHER_ATTEMPT $ESCHER_NODE_ID" >> "$RUNS"; sleep {secs}"#
        );
        Task::command(["sh", "-c", &script])
            .env("RUNS", file.display().to_string())
            .resources_str("cpu=1")
            .max_retries(2)
    };
    let tasks = client
        .submit_batch((0..6).map(|_| sleeper(9)))
        .await
        .unwrap();
    let ids: Vec<TaskId> = tasks.iter().map(|t| t.id()).collect();
    let want = ids.len();
    eventually("every task to start", WAIT, || {
        let started = runs(&file).len();
        async move { (started == want).then_some(()) }
    })
    .await;
    cluster.freeze_head_at(leader, true);
    let frozen_at = Instant::now();
    // A new call, with the frozen replica possibly first in its list.
    let client = cluster.client().await;
    let probe = client.submit(sleeper(0)).await.unwrap();
    let answered = frozen_at.elapsed();
    eprintln!("a submit was answered {answered:?} after the leader froze");
    let statuses = all_terminal(&client, &ids).await;
    cluster.freeze_head_at(leader, false);
    for (id, state) in &statuses {
        assert_eq!(*state, TaskState::Succeeded, "task {id}");
    }
    let lines = runs(&file);
    for id in &ids {
        let attempts: Vec<u32> = lines
            .iter()
            .filter(|(t, _, _)| *t == id.0)
            .map(|(_, a, _)| *a)
            .collect();
        assert_eq!(
            attempts,
            vec![1],
            "task {id} ran once, its first attempt not stopped"
        );
    }
    assert!(
        answered < Duration::from_secs(12),
        "a call made while the leader was frozen waited {answered:?}"
    );
    let done = client.get(probe.id(), Some(WAIT)).await.unwrap();
    assert_eq!(done.state, TaskState::Succeeded, "{done:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_isolated_leader_stops_acknowledging_and_the_majority_goes_on() {
    let mut cluster = ProcessCluster::builder()
        .heads(3)
        .proxied()
        .durable()
        .workers(1)
        .heartbeat_timeout_ms(20_000)
        .start()
        .await;
    let old = cluster.wait_leader().await;
    let node = cluster.node("w1");
    let client = cluster.client().await;
    let mut acked = 0u64;
    client
        .set_resource(COUNTER, 1, NodeSpec::Node(node))
        .await
        .unwrap();
    for _ in 0..5 {
        client
            .adjust_resource(COUNTER, 1, NodeSpec::Node(node))
            .await
            .unwrap();
        acked += 1;
    }

    cluster.isolate(old, true);
    // The minority side: the old leader alone cannot commit, so it acknowledges nothing.
    let minority = Client::connect(cluster.head_url_of(old))
        .await
        .unwrap()
        .with_credentials(cluster.credentials())
        .with_failover_timeout(Duration::from_secs(3));
    let refused = minority
        .adjust_resource(COUNTER, 1, NodeSpec::Node(node))
        .await;
    assert!(
        refused.is_err(),
        "the isolated leader acknowledged a write: {refused:?}"
    );
    // The majority elects a leader and takes writes.
    let others: Vec<String> = (0..3)
        .filter(|i| *i != old)
        .map(|i| cluster.head_url_of(i))
        .collect();
    let majority = Client::connect(others.join(","))
        .await
        .unwrap()
        .with_credentials(cluster.credentials());
    for _ in 0..5 {
        majority
            .adjust_resource(COUNTER, 1, NodeSpec::Node(node))
            .await
            .unwrap();
        acked += 1;
    }
    let heads = majority.heads().await.unwrap();
    let leader = heads.leader().expect("the majority has a leader");
    assert_ne!(leader.id, old as u64 + 1, "{heads:#?}");

    // Healed: the old leader rejoins as a follower and catches up; nothing acknowledged is
    // lost (the write it took alone, never committed, is gone or applied once).
    cluster.isolate(old, false);
    let converged = eventually("the replicas to converge", WAIT, || {
        let majority = majority.clone();
        async move {
            let heads = majority.heads().await.ok()?;
            let applied: BTreeSet<u64> = heads.replicas.iter().map(|r| r.applied_index).collect();
            let all_up = heads.replicas.iter().all(|r| r.reachable);
            (all_up && applied.len() == 1).then_some(heads)
        }
    })
    .await;
    assert_eq!(
        converged
            .replicas
            .iter()
            .filter(|r| r.leader.is_some())
            .count(),
        3
    );
    let total = counter(&majority, node).await - 1;
    assert!(
        (acked..=acked + 1).contains(&total),
        "the counter ({total}) holds the {acked} acknowledged +1s"
    );

    // The whole group restarts from disk.
    for i in 0..3 {
        cluster.kill_head_at(i);
    }
    for i in 0..3 {
        cluster.restart_head_at(i).await;
    }
    cluster.wait_leader().await;
    let client = cluster.client().await;
    assert_eq!(
        counter(&client, node).await - 1,
        total,
        "the restart lost nothing"
    );
    let task = client.submit(Task::command(["true"])).await.unwrap();
    let status = client.get(&task, Some(WAIT)).await.unwrap();
    assert_eq!(status.state, TaskState::Succeeded);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_write_whose_reply_is_dropped_is_applied_exactly_once() {
    let cluster = ProcessCluster::builder()
        .heads(3)
        .workers(1)
        .heartbeat_timeout_ms(20_000)
        .start()
        .await;
    let leader = cluster.wait_leader().await;
    let node = cluster.node("w1");
    // The client reaches every replica through a proxy of the test's; the leader's first.
    let mut proxies = Vec::new();
    for i in std::iter::once(leader).chain((0..3).filter(|i| *i != leader)) {
        let target = cluster
            .head_url_of(i)
            .trim_start_matches("http://")
            .parse()
            .unwrap();
        proxies.push(Proxy::start(target).await);
    }
    let urls: Vec<String> = proxies
        .iter()
        .map(|p| format!("http://{}", p.addr()))
        .collect();
    // A fresh client whose calls go through the leader's proxy (first in its list); after the
    // dropped reply it retries elsewhere, is sent to the leader, and gets the recorded reply.
    let fresh = || async {
        let client = Client::connect(urls.join(","))
            .await
            .unwrap()
            .with_credentials(cluster.credentials());
        client.cluster_status().await.unwrap();
        assert_eq!(
            client.leader_url(),
            urls[0],
            "the leader answered through its proxy"
        );
        client
    };
    let client = fresh().await;
    client
        .set_resource(COUNTER, 1, NodeSpec::Node(node))
        .await
        .unwrap();

    let client = fresh().await;
    proxies[0].drop_next_reply();
    let task = client.submit(Task::command(["true"])).await.unwrap();
    assert_eq!(
        proxies[0].dropped_replies(),
        1,
        "the submit's reply was dropped"
    );
    let listed = client.list_tasks(None, None).await.unwrap();
    assert_eq!(
        listed.iter().map(|t| t.id).collect::<Vec<_>>(),
        [task.id()],
        "one task"
    );

    let client = fresh().await;
    proxies[0].drop_next_reply();
    client
        .adjust_resource(COUNTER, 1, NodeSpec::Node(node))
        .await
        .unwrap();
    assert_eq!(
        proxies[0].dropped_replies(),
        2,
        "the +1's reply was dropped"
    );
    assert_eq!(counter(&client, node).await, 2, "one +1, applied once");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_head_stopped_gracefully_leaves_its_workers_running_their_tasks() {
    let mut cluster = ProcessCluster::builder()
        .durable()
        .heartbeat_timeout_ms(20_000)
        .start()
        .await;
    let node = cluster.node("w1");
    let client = cluster.client().await;
    let file = cluster.shared_path("runs.log");
    let marker = cluster.shared_path("started");
    let task = client
        .submit(
            Task::command([
                "sh",
                "-c",
                r#"touch "$MARK"; sleep 2; echo "$ESCHER_TASK_ID $ESCHER_ATTEMPT $ESCHER_NODE_ID" >> "$RUNS""#,
            ])
            .env("MARK", marker.display().to_string())
            .env("RUNS", file.display().to_string()),
        )
        .await
        .unwrap();
    eventually("the task to start", WAIT, || {
        let started = marker.exists();
        async move { started.then_some(()) }
    })
    .await;
    let exit = cluster.terminate_head_at(0).await;
    assert!(exit.success(), "the head exits cleanly on SIGTERM: {exit}");
    assert!(
        cluster.worker_running("w1"),
        "the worker keeps running without its head"
    );
    cluster.restart_head().await;
    let client = cluster.client().await;
    let status = client.get(&task, Some(WAIT)).await.unwrap();
    assert_eq!(status.state, TaskState::Succeeded, "{status:?}");
    assert_eq!((status.node, status.attempt), (Some(node), 1), "{status:?}");
    assert_eq!(runs(&file), vec![(task.id().0, 1, node.0)], "it ran once");
    // Not draining either: it takes new work.
    let next = client.submit(logged_task(&file)).await.unwrap();
    let status = client.get(&next, Some(WAIT)).await.unwrap();
    assert_eq!(
        (status.state, status.node),
        (TaskState::Succeeded, Some(node))
    );
    assert!(cluster.worker_running("w1"));
}

/// A leader stopped for a planned restart (SIGTERM) hands leadership to the most up-to-date
/// follower before it stops serving, as etcd's does, so the others need not wait out an
/// election timeout: the replica it names leads once it has exited, in the next term, and
/// writes go on.
#[tokio::test(flavor = "multi_thread")]
async fn a_leader_stopped_gracefully_hands_leadership_over() {
    let mut cluster = ProcessCluster::builder().heads(3).durable().start().await;
    let client = cluster.client().await;
    client.submit(Task::command(["true"])).await.unwrap();
    let leader = cluster.wait_leader().await;
    let term = client
        .heads()
        .await
        .unwrap()
        .leader()
        .expect("a leader")
        .term;
    let exit = cluster.terminate_head_at(leader).await;
    assert!(
        exit.success(),
        "the leader exits cleanly on SIGTERM: {exit}"
    );
    let said = cluster.exited_head_output(leader);
    let line = said
        .lines()
        .find(|l| l.contains("leadership handed over"))
        .unwrap_or_else(|| panic!("the leader did not hand over:\n{said}"));
    let to: u64 = line
        .split("to=")
        .nth(1)
        .and_then(|rest| rest.split_whitespace().next())
        .and_then(|id| id.parse().ok())
        .unwrap_or_else(|| panic!("no replica named in {line:?}"));
    let heads = eventually("a new leader", WAIT, || {
        let client = &client;
        async move {
            let heads = client.heads().await.ok()?;
            heads.leader().is_some().then_some(heads)
        }
    })
    .await;
    let now = heads.leader().expect("a leader");
    assert_eq!(now.id, to, "{heads:?}");
    assert_eq!(
        now.term,
        term + 1,
        "one term more, no other election: {heads:?}"
    );
    // It campaigned because the old leader told it to (raft's MsgTimeoutNow), not because its
    // election timeout ran out.
    let index = usize::try_from(to - 1).unwrap();
    let its_log = cluster.head_output(index);
    assert!(its_log.contains("MsgTimeoutNow"), "{its_log}");
    client.submit(Task::command(["true"])).await.unwrap();
}

/// Runs `escher-head` with `args` until it exits by itself (bounded); returns its status and
/// what it printed.
fn head_refuses(args: &[&str]) -> (std::process::ExitStatus, String) {
    let bin = std::env::current_exe()
        .unwrap()
        .parent()
        .and_then(|deps| deps.parent())
        .unwrap()
        .join("escher-head");
    // The head writes its access file there, not into the user's ~/.escher.
    let home = tempfile::tempdir().unwrap();
    let mut child = std::process::Command::new(bin)
        .args(args)
        .env("ESCHER_HOME", home.path())
        .env_remove("ESCHER_ACCESS_FILE")
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("escher-head starts");
    let started = Instant::now();
    let status = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break status;
        }
        if started.elapsed() > WAIT {
            let _ = child.kill();
            panic!("escher-head {args:?} did not refuse to start");
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    let output = child.wait_with_output().unwrap();
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    (status, text)
}

#[test]
fn a_replica_with_inconsistent_settings_refuses_to_start_and_says_why() {
    let (status, text) = head_refuses(&[
        "--listen",
        "127.0.0.1:0",
        "--id",
        "4",
        "--peers",
        "1=127.0.0.1:7701,2=127.0.0.1:7702,3=127.0.0.1:7703",
    ]);
    assert!(!status.success());
    assert!(
        text.contains("does not include this replica's own --id 4"),
        "{text}"
    );

    // A data directory created by another group, or for another replica, is refused.
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("head");
    let data = data.to_str().unwrap();
    let mut first = std::process::Command::new(
        std::env::current_exe()
            .unwrap()
            .parent()
            .and_then(|deps| deps.parent())
            .unwrap()
            .join("escher-head"),
    )
    .args([
        "--listen",
        "127.0.0.1:0",
        "--data-dir",
        data,
        "--group",
        "one",
        "--address-file",
    ])
    .arg(dir.path().join("url"))
    .env("ESCHER_HOME", dir.path())
    .env_remove("ESCHER_ACCESS_FILE")
    .stdout(std::process::Stdio::null())
    .stderr(std::process::Stdio::null())
    .spawn()
    .unwrap();
    let url = dir.path().join("url");
    let started = Instant::now();
    while !url.exists() {
        assert!(started.elapsed() < WAIT, "the first head did not start");
        std::thread::sleep(Duration::from_millis(20));
    }
    let _ = first.kill();
    let _ = first.wait();
    let (status, text) = head_refuses(&[
        "--listen",
        "127.0.0.1:0",
        "--data-dir",
        data,
        "--group",
        "two",
    ]);
    assert!(!status.success());
    assert!(text.contains(data) && text.contains("one"), "{text}");
    let (status, text) = head_refuses(&[
        "--listen",
        "127.0.0.1:0",
        "--data-dir",
        data,
        "--group",
        "one",
        "--id",
        "2",
    ]);
    assert!(!status.success());
    assert!(text.contains("replica"), "{text}");
}

/// Replicas accept raft messages only with their peer token: the admin token is refused. And a
/// forged raft heartbeat whose commit index is beyond a follower's log (which panics raft-rs
/// inside the replica), sent with the peer token, is refused before raft-rs sees it, and the
/// group goes on acknowledging writes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn forged_raft_messages_are_refused_and_the_group_goes_on() {
    use escher::access::Bearer;
    use escher_proto::wire::{self, raft_client::RaftClient};
    use protobuf::Message as _;
    use raft::eraftpb::{Message, MessageType};

    let cluster = ProcessCluster::builder().heads(3).workers(1).start().await;
    let client = cluster.client().await;
    let heads = client.heads().await.unwrap();
    let leader = heads.leader().expect("a leader").clone();
    let admin = cluster.credentials().secret().unwrap();
    let access = escher::access::AccessFile::read(&cluster.access_file()).unwrap();
    let (token, derived) = access.peer_token();
    assert!(!derived, "a new access file has a peer token of its own");
    assert_ne!(token, admin);
    for follower in heads.replicas.iter().filter(|r| r.id != leader.id) {
        let mut forged = Message::default();
        forged.set_msg_type(MessageType::MsgHeartbeat);
        forged.from = leader.id;
        forged.to = follower.id;
        forged.term = leader.term;
        forged.commit = 1_000_000_000;
        let batch = wire::RaftBatch {
            group: heads.group.clone(),
            from: leader.id,
            from_address: leader.address.clone(),
            to: follower.id,
            messages: vec![forged.write_to_bytes().unwrap()],
            data_format: 1,
        };
        let channel =
            tonic::transport::Endpoint::from_shared(format!("http://{}", follower.address))
                .unwrap()
                .connect()
                .await
                .unwrap();
        let mut as_admin = RaftClient::with_interceptor(channel.clone(), Bearer::new(&admin));
        let refused = as_admin.send(batch.clone()).await.unwrap_err();
        assert_eq!(refused.code(), tonic::Code::PermissionDenied, "{refused:?}");
        assert!(refused.message().contains("peer token"), "{refused:?}");
        let mut raft = RaftClient::with_interceptor(channel, Bearer::new(&token));
        for _ in 0..3 {
            raft.send(batch.clone()).await.unwrap();
        }
    }
    // Every replica still runs and answers, and a write is acknowledged by the group.
    tokio::time::sleep(Duration::from_millis(500)).await;
    let task = client
        .submit(Task::command(["true"]).resources_str("cpu=1"))
        .await
        .unwrap();
    let (done, _) = client.wait([task.id()], 1, Some(WAIT)).await.unwrap();
    assert_eq!(done[0].state, TaskState::Succeeded);
    let after = client.heads().await.unwrap();
    for replica in &after.replicas {
        assert!(
            replica.reachable && replica.error.is_none(),
            "replica {} after the forgery: {replica:?}",
            replica.id
        );
    }
}

/// A durable head alone snapshots and compacts its log as a group of three does: every commit
/// of a group of one reaches the log after its cycle's writes, and compaction used to wait for
/// a durable commit index that never came, so the log and a restart's memory grew forever.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_durable_lone_head_snapshots_and_compacts_its_log() {
    let mut cluster = ProcessCluster::builder()
        .durable()
        .workers(1)
        .head_args(&["--snapshot-log-bytes", "100000"])
        .start()
        .await;
    let client = cluster.client().await;
    let tasks: Vec<Task> = (0..1500)
        .map(|_| Task::command(["true"]).resources_str("cpu=1"))
        .collect();
    let refs = client.submit_batch(tasks).await.unwrap();
    let ids: Vec<TaskId> = refs.iter().map(|t| t.id()).collect();
    all_terminal(&client, &ids).await;
    eventually("the lone head to take a snapshot", WAIT, || {
        let out = cluster.head_output(0);
        async move { out.contains("snapshot taken; log compacted").then_some(()) }
    })
    .await;
    // After a restart from the compacted log everything is still there, and ids go on.
    cluster.kill_head();
    cluster.restart_head().await;
    let client = cluster.client().await;
    let (done, _) = client
        .wait(ids.iter().copied(), ids.len(), Some(WAIT))
        .await
        .unwrap();
    assert_eq!(done.len(), ids.len());
    let next = client.submit(Task::command(["true"])).await.unwrap();
    assert!(next.id() > *ids.last().unwrap());
}

/// A submit whose outcome the client cannot learn (a lone head; the connection broke with the
/// reply on its way back) is reported as such, with its idempotency key, never as a plain
/// failure that a retry would double; `escher submit --key KEY` retried under that key applies
/// nothing twice and prints the ids the head recorded.
#[tokio::test]
async fn a_submit_whose_reply_is_lost_is_unknown_and_its_key_retries_it_once() {
    let cluster = ProcessCluster::builder()
        .workers(1)
        .heartbeat_timeout_ms(20_000)
        .start()
        .await;
    let target = cluster
        .head_url()
        .trim_start_matches("http://")
        .parse()
        .unwrap();
    let proxy = Proxy::start(target).await;
    let client = Client::connect(format!("http://{}", proxy.addr()))
        .await
        .unwrap()
        .with_credentials(cluster.credentials());
    client.cluster_status().await.unwrap();
    // The reply, and the reply to the client's own retry under the same key.
    proxy.drop_replies(2);
    let batch = vec![Task::command(["true"]).resources_str("cpu=0.1"); 3];
    let err = client.submit_batch(batch).await.unwrap_err();
    let escher::ClientError::UnknownOutcome { key, .. } = &err else {
        panic!("not an unknown outcome: {err}");
    };
    let text = err.to_string();
    assert!(
        text.contains("may or may not have been applied") && text.contains(&format!("--key {key}")),
        "{text}"
    );
    let direct = cluster.client().await;
    let applied: Vec<TaskId> = direct
        .list_tasks(None, None)
        .await
        .unwrap()
        .iter()
        .map(|t| t.id)
        .collect();
    assert!(
        applied.is_empty() || applied.len() == 3,
        "all or nothing: {applied:?}"
    );

    let retry = std::process::Command::new(procs::binary("escher"))
        .args([
            "submit", "--count", "3", "-r", "cpu=0.1", "--key", key, "true",
        ])
        .env("ESCHER_HOME", cluster.dir().join("escher-home"))
        .env_remove("ESCHER_HEAD")
        .output()
        .unwrap();
    assert!(retry.status.success(), "{retry:?}");
    let printed: Vec<TaskId> = String::from_utf8_lossy(&retry.stdout)
        .split_whitespace()
        .map(|id| id.parse().expect("a task id"))
        .collect();
    assert_eq!(printed.len(), 3, "{printed:?}");
    if !applied.is_empty() {
        assert_eq!(printed, applied, "the retry answers with the recorded ids");
    }
    let after: Vec<TaskId> = direct
        .list_tasks(None, None)
        .await
        .unwrap()
        .iter()
        .map(|t| t.id)
        .collect();
    assert_eq!(after, printed, "applied once, under its key: {after:?}");

    let bad = std::process::Command::new(procs::binary("escher"))
        .args(["submit", "--key", "not-a-key", "true"])
        .env("ESCHER_HOME", cluster.dir().join("escher-home"))
        .env_remove("ESCHER_HEAD")
        .output()
        .unwrap();
    assert!(!bad.status.success());
    let said = String::from_utf8_lossy(&bad.stderr);
    assert!(said.contains("CLIENT-SEQ"), "{said}");
    assert_eq!(direct.list_tasks(None, None).await.unwrap().len(), 3);
}

/// With no majority up, a call says so once its failover timeout passes, listing what each
/// replica answered, instead of naming one dead replica's "Connection refused".
#[tokio::test]
async fn with_no_majority_the_error_says_so_and_what_each_replica_answered() {
    let mut cluster = ProcessCluster::builder()
        .heads(3)
        .workers(0)
        .heartbeat_timeout_ms(20_000)
        .start()
        .await;
    let leader = cluster.wait_leader().await;
    let survivor = (leader + 1) % 3;
    for i in (0..3).filter(|i| *i != survivor) {
        cluster.kill_head_at(i);
    }
    let client = Client::connect(cluster.head_url())
        .await
        .unwrap()
        .with_credentials(cluster.credentials())
        .with_failover_timeout(Duration::from_secs(3));
    let err = client
        .submit(Task::command(["true"]))
        .await
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("no head replica answered as the leader"),
        "{err}"
    );
    assert!(err.contains("majority"), "{err}");
    assert!(err.contains("up, no leader known"), "{err}");
    assert!(err.contains("down (the connection was refused)"), "{err}");
}

/// A task's logs are read through any replica: one that does not lead names the leader, which
/// the client follows, as for every other call.
#[tokio::test]
async fn logs_are_read_through_a_replica_that_does_not_lead() {
    let cluster = ProcessCluster::builder()
        .heads(3)
        .workers(1)
        .heartbeat_timeout_ms(20_000)
        .start()
        .await;
    let leader = cluster.wait_leader().await;
    let client = cluster.client().await;
    let done = client
        .run(Task::command(["echo", "hello from a task"]), Some(WAIT))
        .await
        .unwrap();
    let follower = (leader + 1) % 3;
    let urls: Vec<String> = std::iter::once(follower)
        .chain((0..3).filter(|i| *i != follower))
        .map(|i| cluster.head_url_of(i))
        .collect();
    let through = Client::connect(urls.join(","))
        .await
        .unwrap()
        .with_credentials(cluster.credentials());
    let out = through
        .logs(done.id, escher::types::LogStream::Stdout)
        .await
        .unwrap();
    assert_eq!(String::from_utf8_lossy(&out), "hello from a task\n");
}
