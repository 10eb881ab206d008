//! End-to-end tests of failures and recoveries, with real `escher-head` and `escher-worker`
//! processes on loopback (see `procs/mod.rs`): a worker killed with SIGKILL, a worker
//! restarted with its state directory (same node) or without (a new node), an in-memory head
//! restarted on the same address, a worker stopped gracefully with SIGTERM; and 10,000 tasks
//! through an in-process cluster, each finishing exactly once.
//!
//! Command tasks here record every attempt that reached a process: they append
//! `NODE ATTEMPT` to a file named after their task id in the cluster's temporary directory
//! (a [`RunLog`]), so that the tests can tell "ran twice" from "reported twice". Tasks that
//! must still be running when something is killed sleep on their first attempt only; the
//! tests wait for their line before killing, and never on how fast anything is.
//!
//! Every wait is bounded ([`WAIT`]); the processes are few (one head, at most two workers)
//! because the machine may be small and running other tests.

mod procs;

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use escher::types::{NodeId, NodeSpec, TaskId, TaskResult, TaskState, TaskStatus};
use escher::{Client, Functions, LocalCluster, Task, TaskRef};
use procs::{ProcessCluster, WAIT, eventually};

/// The files in which command tasks record their attempts.
#[derive(Debug, Clone)]
struct RunLog {
    dir: PathBuf,
}

impl RunLog {
    /// A run log in `base` (a cluster's directory); `name` keeps two logs of one test apart.
    /// The tasks write it as whichever user they run as (a user of their own when the workers
    /// run as root, as in CI): `base` is opened for passing through, the log for writing.
    fn new(base: &Path, name: &str) -> RunLog {
        use std::os::unix::fs::PermissionsExt;
        let dir = base.join(name);
        std::fs::create_dir_all(&dir).expect("the run log directory");
        let mode = |path: &Path, mode| {
            std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode))
                .expect("the run log's mode")
        };
        mode(base, 0o711);
        mode(&dir, 0o777);
        RunLog { dir }
    }

    /// A command task (1 CPU) that records its attempt and its process (pid and PID
    /// namespace), then, if `sleep_first` and this is its first attempt, sleeps far longer than
    /// any test runs.
    fn task(&self, sleep_first: bool) -> Task {
        let mut script = format!(
            r#"echo "$ESCHER_NODE_ID $ESCHER_ATTEMPT" >> "$RUNS/$ESCHER_TASK_ID"; {} > "$RUNS/$ESCHER_TASK_ID.pid""#,
            procs::RECORD_PID
        );
        if sleep_first {
            script.push_str(r#"; if [ "$ESCHER_ATTEMPT" = 1 ]; then exec sleep 600; fi"#);
        }
        Task::command(["sh", "-c", &script])
            .env("RUNS", self.dir.display().to_string())
            .resources_str("cpu=1")
    }

    /// A command task (1 CPU) that records its attempt, then sleeps `secs` seconds.
    fn sleeping_task(&self, secs: u32) -> Task {
        let script = format!(
            r#"echo "$ESCHER_NODE_ID $ESCHER_ATTEMPT" >> "$RUNS/$ESCHER_TASK_ID"; sleep {secs}"#
        );
        Task::command(["sh", "-c", &script])
            .env("RUNS", self.dir.display().to_string())
            .resources_str("cpu=1")
    }

    /// The attempts of `task` that reached a process: (node, attempt), in order.
    fn runs(&self, task: TaskId) -> Vec<(NodeId, u32)> {
        let text = std::fs::read_to_string(self.dir.join(task.0.to_string())).unwrap_or_default();
        text.lines()
            .map(|line| {
                let (node, attempt) = line
                    .split_once(' ')
                    .unwrap_or_else(|| panic!("a malformed run line {line:?}"));
                (
                    NodeId(node.parse().expect("a node id")),
                    attempt.parse().expect("an attempt"),
                )
            })
            .collect()
    }

    /// Waits until the latest attempt of `task` has recorded its process, and returns its pid
    /// on the host, or `None` if it has ended already. The script writes its run line first
    /// and its pid after, so a test that saw the run must still wait for the pid.
    async fn wait_pid(&self, task: TaskId) -> Option<i32> {
        let file = self.dir.join(format!("{}.pid", task.0));
        let recorded = eventually(&format!("task {task} to record its pid"), WAIT, || {
            let text = std::fs::read_to_string(&file)
                .ok()
                .filter(|t| t.ends_with('\n'));
            async move { text }
        })
        .await;
        procs::host_pid(&recorded)
    }

    /// Waits until `task` has recorded `n` attempts.
    async fn wait_runs(&self, task: TaskId, n: usize) {
        let what = format!("task {task} to record {n} run(s)");
        eventually(&what, WAIT, || {
            let done = self.runs(task).len() >= n;
            async move { done.then_some(()) }
        })
        .await;
    }
}

/// Whether process `pid` is still alive and one of this test's (its environment names the
/// run log directory), so that a reused pid is never mistaken for it.
fn task_process_alive(pid: i32, runs: &RunLog) -> bool {
    let needle = format!("RUNS={}", runs.dir.display());
    std::fs::read(format!("/proc/{pid}/environ"))
        .map(|env| env.split(|b| *b == 0).any(|v| v == needle.as_bytes()))
        .unwrap_or(false)
}

/// Waits for every task and returns their final statuses by id.
async fn wait_all(client: &Client, tasks: &[TaskRef]) -> BTreeMap<TaskId, TaskStatus> {
    let ids: Vec<TaskId> = tasks.iter().map(TaskRef::id).collect();
    let (ready, not_ready) = client
        .wait(ids.iter().copied(), ids.len(), Some(WAIT))
        .await
        .expect("wait");
    assert!(
        not_ready.is_empty(),
        "tasks not finished after {WAIT:?}: {not_ready:?}"
    );
    let statuses: BTreeMap<TaskId, TaskStatus> = ready.into_iter().map(|s| (s.id, s)).collect();
    assert_eq!(statuses.len(), ids.len(), "wait returned each task once");
    statuses
}

/// Asserts that a status is a success of attempt `attempt` on `node`, with exit code 0.
fn assert_succeeded(status: &TaskStatus, node: NodeId, attempt: u32) {
    assert_eq!(status.state, TaskState::Succeeded, "{status:?}");
    assert_eq!(status.node, Some(node), "{status:?}");
    assert_eq!(status.attempt, attempt, "{status:?}");
    assert_eq!(
        status.result,
        Some(TaskResult::Exited { code: 0 }),
        "{status:?}"
    );
}

/// SIGKILL of a worker process: the head declares its node lost within a few heartbeat
/// timeouts, drops its resources (ephemeral ones included), runs its tasks again elsewhere
/// while they have retries left, and fails the rest with a reason that says the node was lost.
#[tokio::test]
async fn a_killed_worker_is_declared_lost_and_its_tasks_are_retried_elsewhere() {
    // The victim starts alone, so every task lands on it; the survivor joins before the kill.
    let mut cluster = ProcessCluster::builder()
        .resources("cpu=4,memory=512")
        .start()
        .await;
    let client = cluster.client().await;
    let victim = cluster.node("w1");
    let runs = RunLog::new(cluster.dir(), "runs");

    client
        .set_resource("e2e-marker", 3, NodeSpec::Node(victim))
        .await
        .expect("set_resource on the victim");
    let status = client.cluster_status().await.unwrap();
    let marker = status.node(victim).unwrap().resource("e2e-marker");
    assert!(marker.is_some(), "{status:#?}");

    let retried = client
        .submit_batch((0..2).map(|_| runs.task(true).max_retries(1)))
        .await
        .unwrap();
    let doomed = client
        .submit_batch((0..2).map(|_| runs.task(true).max_retries(0)))
        .await
        .unwrap();
    for task in retried.iter().chain(&doomed) {
        runs.wait_runs(task.id(), 1).await;
    }
    let survivor = cluster.start_worker("w2", "cpu=2,memory=512").await;

    cluster.kill_worker("w1");
    let lost = cluster
        .wait_status("the killed worker's node to be declared lost", |s| {
            s.node(victim).filter(|n| !n.alive).cloned()
        })
        .await;
    assert!(
        lost.resources.is_empty(),
        "a lost node keeps no resources: {lost:#?}"
    );
    let status = client.cluster_status().await.unwrap();
    assert!(
        status
            .nodes
            .iter()
            .all(|n| n.resource("e2e-marker").is_none()),
        "the ephemeral resource of the lost node is gone: {status:#?}"
    );
    assert!(status.node(survivor).is_some_and(|n| n.alive));

    let all: Vec<TaskRef> = retried.iter().chain(&doomed).cloned().collect();
    let statuses = wait_all(&client, &all).await;
    for task in &retried {
        let s = &statuses[&task.id()];
        assert_succeeded(s, survivor, 2);
        assert_eq!(runs.runs(task.id()), vec![(victim, 1), (survivor, 2)]);
    }
    for task in &doomed {
        let s = &statuses[&task.id()];
        assert_eq!(s.state, TaskState::Failed, "{s:?}");
        assert_eq!((s.node, s.attempt), (Some(victim), 1), "{s:?}");
        let reason = s.reason.as_deref().unwrap_or_default();
        assert!(reason.contains("lost"), "reason {reason:?} in {s:?}");
        assert_eq!(runs.runs(task.id()), vec![(victim, 1)]);
    }

    // Nothing is left allocated on the survivor, and nothing is pending or running.
    cluster
        .wait_status("the survivor to be idle", |s| {
            let n = s.node(survivor)?;
            let idle = n.resources.iter().all(|r| r.used.is_zero());
            (idle && s.pending_tasks == 0 && s.running_tasks == 0).then_some(())
        })
        .await;
}

/// A lost worker neither loses work nor runs it twice: tasks that had succeeded on it stay
/// succeeded (attempt 1, run once), the tasks it was running run again exactly once, and tasks
/// submitted around the kill all finish; every attempt that reached a process is accounted for.
#[tokio::test]
async fn a_lost_worker_loses_nothing_and_reruns_nothing_that_succeeded() {
    let mut cluster = ProcessCluster::builder()
        .resources("cpu=4,memory=512")
        .start()
        .await;
    let client = cluster.client().await;
    let victim = cluster.node("w1");
    let runs = RunLog::new(cluster.dir(), "runs");

    // Done before the kill, all on the victim.
    let early = client
        .submit_batch((0..20).map(|_| runs.task(false).max_retries(1)))
        .await
        .unwrap();
    for (id, s) in wait_all(&client, &early).await {
        assert_succeeded(&s, victim, 1);
        assert_eq!(runs.runs(id), vec![(victim, 1)]);
    }
    // Running on the victim when it dies.
    let running = client
        .submit_batch((0..3).map(|_| runs.task(true).max_retries(1)))
        .await
        .unwrap();
    for task in &running {
        runs.wait_runs(task.id(), 1).await;
    }
    let survivor = cluster.start_worker("w2", "cpu=2,memory=512").await;
    cluster.kill_worker("w1");
    // Submitted while the head may still believe the victim alive: some may be sent to it.
    let around = client
        .submit_batch((0..10).map(|_| runs.task(false).max_retries(2)))
        .await
        .unwrap();
    cluster
        .wait_status("the killed worker's node to be declared lost", |s| {
            s.node(victim).filter(|n| !n.alive).map(|_| ())
        })
        .await;
    let after = client
        .submit_batch((0..10).map(|_| runs.task(false)))
        .await
        .unwrap();

    let all: Vec<TaskRef> = [&early, &running, &around, &after]
        .into_iter()
        .flatten()
        .cloned()
        .collect();
    let statuses = wait_all(&client, &all).await;
    assert!(
        statuses.values().all(|s| s.state == TaskState::Succeeded),
        "every task succeeded: {statuses:#?}"
    );
    for task in &early {
        assert_succeeded(&statuses[&task.id()], victim, 1);
        assert_eq!(
            runs.runs(task.id()),
            vec![(victim, 1)],
            "run once, never again"
        );
    }
    for task in &running {
        assert_succeeded(&statuses[&task.id()], survivor, 2);
        assert_eq!(runs.runs(task.id()), vec![(victim, 1), (survivor, 2)]);
    }
    for task in around.iter().chain(&after) {
        let s = &statuses[&task.id()];
        let seen = runs.runs(task.id());
        // An attempt sent to the dead victim never reached a process; the last one did, once.
        assert_eq!(seen.last(), Some(&(s.node.unwrap(), s.attempt)), "{s:?}");
        let attempts: BTreeSet<u32> = seen.iter().map(|(_, a)| *a).collect();
        assert_eq!(attempts.len(), seen.len(), "an attempt ran twice: {seen:?}");
        assert!(seen.iter().all(|(n, _)| *n == survivor), "{seen:?}");
        assert_eq!(
            seen.len(),
            1,
            "only the survivor's attempt reached a process"
        );
    }
    for task in &after {
        assert_succeeded(&statuses[&task.id()], survivor, 1);
    }

    // The head's own accounting agrees: every task once, all succeeded.
    let listed = client.list_tasks(None, None).await.unwrap();
    let ids: Vec<TaskId> = listed.iter().map(|t| t.id).collect();
    let expected: Vec<TaskId> = statuses.keys().copied().collect();
    assert_eq!(ids, expected);
    assert!(listed.iter().all(|t| t.state == TaskState::Succeeded));
}

/// A worker process killed and started again with the same state directory keeps its node id:
/// the head sees a new boot, counts the attempt it was running as lost (retried under
/// `max_retries`), and the node runs tasks again. Started with a fresh state directory instead,
/// a worker joins as a new node and the old one is declared lost.
#[tokio::test]
async fn a_restarted_worker_keeps_its_node_and_one_with_a_fresh_state_dir_is_a_new_node() {
    let mut cluster = ProcessCluster::builder().workers(2).start().await;
    let client = cluster.client().await;
    let old = cluster.node("w1");
    let runs = RunLog::new(cluster.dir(), "runs");
    client
        .set_resource("on-w1", 1, NodeSpec::Node(old))
        .await
        .unwrap();
    let interrupted = client
        .submit(runs.task(true).resource("on-w1", 1).max_retries(1))
        .await
        .unwrap();
    runs.wait_runs(interrupted.id(), 1).await;

    cluster.kill_worker("w1");
    let again = cluster.start_worker_known("w1", "cpu=2,memory=512").await;
    assert_eq!(again, old, "a restarted worker keeps its node id");
    // The attempt it ran was lost with the process, and runs again (the ephemeral resource
    // went with the node's restart, so the retry waits for it to be set again).
    client
        .set_resource("on-w1", 1, NodeSpec::Node(old))
        .await
        .unwrap();
    let s = client.get(&interrupted, Some(WAIT)).await.unwrap();
    assert_succeeded(&s, old, 2);
    assert_eq!(runs.runs(interrupted.id()), vec![(old, 1), (old, 2)]);

    // A fresh state directory: a new node; the old one is declared lost.
    cluster.kill_worker("w1");
    cluster.forget_worker("w1");
    let new = cluster.start_worker("w1", "cpu=2,memory=512").await;
    assert_ne!(
        new, old,
        "a worker with a fresh state directory is a new node"
    );
    cluster
        .wait_status("the old node to be declared lost", |s| {
            s.node(old).filter(|n| !n.alive).map(|_| ())
        })
        .await;
    let status = client.cluster_status().await.unwrap();
    let live: BTreeSet<(&str, NodeId)> = status
        .nodes
        .iter()
        .filter(|n| n.alive)
        .map(|n| (n.name.as_str(), n.id))
        .collect();
    let expected = BTreeSet::from([("w1", new), ("w2", cluster.node("w2"))]);
    assert_eq!(live, expected, "{status:#?}");
    let anywhere = client
        .submit_batch((0..6).map(|_| runs.task(false)))
        .await
        .unwrap();
    for (id, s) in wait_all(&client, &anywhere).await {
        assert_eq!(s.state, TaskState::Succeeded, "{s:?}");
        assert_ne!(s.node, Some(old), "{s:?}");
        assert_eq!(runs.runs(id).len(), 1);
    }
}

/// An in-memory head killed and started again on the same address (it kept no state): the
/// worker's identity belongs to the cluster that is gone, so it registers with the new head as
/// a new node, stops what the old head had given it (the new head knows nothing of it, and
/// reuses its task ids), and runs the new head's tasks.
#[tokio::test]
async fn a_worker_survives_a_head_restart_and_runs_the_new_heads_tasks() {
    let mut cluster = ProcessCluster::builder().start().await;
    let client = cluster.client().await;
    let before = RunLog::new(cluster.dir(), "before");

    let old_task = client.submit(before.task(true)).await.unwrap();
    before.wait_runs(old_task.id(), 1).await;
    let old_pid = before
        .wait_pid(old_task.id())
        .await
        .expect("the old head's task runs");
    assert!(task_process_alive(old_pid, &before));

    cluster.kill_head();
    cluster.restart_head().await;
    let node = cluster.wait_registered("w1", &BTreeSet::new()).await;
    let client_after = cluster.client().await;
    drop(client);

    // The old head's task is not running invisibly on the new head's node.
    let what = format!("the old head's task (pid {old_pid}) to be stopped");
    eventually(&what, WAIT, || {
        let alive = task_process_alive(old_pid, &before);
        async move { (!alive).then_some(()) }
    })
    .await;

    // The new head numbers tasks from 1 again: they must run, each once, and succeed.
    let after = RunLog::new(cluster.dir(), "after");
    let tasks = client_after
        .submit_batch((0..3).map(|_| after.task(false)))
        .await
        .unwrap();
    for (id, s) in wait_all(&client_after, &tasks).await {
        assert_succeeded(&s, node, 1);
        assert_eq!(after.runs(id), vec![(node, 1)]);
    }
    let status = client_after.cluster_status().await.unwrap();
    let live: Vec<&str> = status
        .nodes
        .iter()
        .filter(|n| n.alive)
        .map(|n| n.name.as_str())
        .collect();
    assert_eq!(live, vec!["w1"], "{status:#?}");
}

/// SIGTERM to a worker process: the task it runs completes and is reported succeeded, nothing
/// new is sent to it while it drains, and its node leaves the cluster as soon as it is done,
/// long before the heartbeat timeout (set far beyond the test's waits).
#[tokio::test]
async fn a_terminated_worker_drains_and_leaves_without_the_heartbeat_timeout() {
    let mut cluster = ProcessCluster::builder()
        .workers(2)
        .heartbeat_timeout_ms(600_000)
        .start()
        .await;
    let client = cluster.client().await;
    let (leaving, staying) = (cluster.node("w1"), cluster.node("w2"));
    let runs = RunLog::new(cluster.dir(), "runs");

    client
        .set_resource("on-w1", 1, NodeSpec::Node(leaving))
        .await
        .unwrap();
    let draining_task = client
        .submit(runs.sleeping_task(2).resource("on-w1", 1))
        .await
        .unwrap();
    runs.wait_runs(draining_task.id(), 1).await;

    cluster.terminate_worker("w1");
    // Draining: the head zeroes the node's capacities, so what no task holds disappears.
    cluster
        .wait_status("the head to see w1 draining", |s| {
            let n = s.node(leaving)?;
            (!n.alive || n.resource("memory").is_none()).then_some(())
        })
        .await;
    // Sent anywhere, with no retries: one sent to the draining worker would fail.
    let later = client
        .submit_batch((0..4).map(|_| runs.task(false)))
        .await
        .unwrap();
    for (id, s) in wait_all(&client, &later).await {
        assert_succeeded(&s, staying, 1);
        assert_eq!(runs.runs(id), vec![(staying, 1)]);
    }

    let s = client.get(&draining_task, Some(WAIT)).await.unwrap();
    assert_succeeded(&s, leaving, 1);
    assert_eq!(runs.runs(draining_task.id()), vec![(leaving, 1)]);

    let gone = cluster
        .wait_status("the drained node to leave the cluster", |s| {
            s.node(leaving).filter(|n| !n.alive).cloned()
        })
        .await;
    assert!(gone.resources.is_empty(), "{gone:#?}");
    let exit = cluster.wait_worker_exit("w1").await;
    assert!(
        exit.success(),
        "the worker exits cleanly after draining: {exit}"
    );
    let status = client.cluster_status().await.unwrap();
    assert!(status.node(staying).is_some_and(|n| n.alive), "{status:#?}");
}

/// 10,000 no-op function tasks through an in-process cluster, submitted in batches: every one
/// runs once, succeeds on its first attempt, and is reported once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ten_thousand_tasks_each_run_and_finish_exactly_once() {
    const TASKS: usize = 10_000;
    const BATCH: usize = 500;
    let executions: Arc<Mutex<BTreeMap<(TaskId, u32), u32>>> = Arc::default();
    let seen = Arc::clone(&executions);
    let functions = Functions::new().function("noop", move |ctx, _args| {
        *seen
            .lock()
            .unwrap()
            .entry((ctx.task_id(), ctx.attempt()))
            .or_default() += 1;
        async move { Ok(Vec::new()) }
    });
    let cluster = LocalCluster::builder()
        .workers(2)
        .functions(functions)
        .start()
        .await
        .expect("a local cluster");
    let client = cluster.client().await.unwrap();

    let run = async {
        let mut refs = Vec::with_capacity(TASKS);
        for _ in 0..TASKS / BATCH {
            let batch =
                (0..BATCH).map(|_| Task::function("noop", Vec::new()).resources_str("cpu=0.001"));
            refs.extend(client.submit_batch(batch).await.unwrap());
        }
        let (ready, not_ready) = client
            .wait(refs.iter().map(TaskRef::id), TASKS, None)
            .await
            .unwrap();
        (refs, ready, not_ready)
    };
    let (refs, ready, not_ready) = tokio::time::timeout(Duration::from_secs(180), run)
        .await
        .expect("10,000 no-op tasks finish within 3 minutes");
    assert!(not_ready.is_empty(), "{} not finished", not_ready.len());

    let submitted: BTreeSet<TaskId> = refs.iter().map(TaskRef::id).collect();
    assert_eq!(
        submitted.len(),
        TASKS,
        "every submitted task has its own id"
    );
    let finished: BTreeSet<TaskId> = ready.iter().map(|s| s.id).collect();
    assert_eq!(ready.len(), TASKS);
    assert_eq!(finished, submitted, "wait returns each task once");
    for s in &ready {
        assert_eq!(s.state, TaskState::Succeeded, "{s:?}");
        assert_eq!(s.attempt, 1, "{s:?}");
    }

    let listed = client
        .list_tasks(Some(TaskState::Succeeded), None)
        .await
        .unwrap();
    assert_eq!(listed.len(), TASKS);
    let listed: BTreeSet<TaskId> = listed.iter().map(|t| t.id).collect();
    assert_eq!(listed, submitted, "list_tasks names each task once");

    let executions = executions.lock().unwrap().clone();
    assert_eq!(executions.len(), TASKS, "every task ran");
    assert!(
        executions
            .iter()
            .all(|((id, attempt), n)| *n == 1 && *attempt == 1 && submitted.contains(id)),
        "each task ran exactly once, as its first attempt"
    );
    let status = client.cluster_status().await.unwrap();
    assert_eq!((status.pending_tasks, status.running_tasks), (0, 0));
    cluster.shutdown().await;
}

/// A cancel sent while the worker's stream is down is not lost: the task ends cancelled once
/// the worker is back (its registration re-derives the cancel from the head's state), and a
/// second `cancel` sends it again.
#[tokio::test]
async fn a_cancel_sent_while_the_workers_stream_is_down_reaches_the_task() {
    let mut cluster = ProcessCluster::builder()
        .workers(0)
        .heartbeat_timeout_ms(10_000)
        .start()
        .await;
    let client = cluster.client().await;
    let node = cluster
        .start_worker_behind_proxy("w1", "cpu=2,memory=512")
        .await;
    let runs = RunLog::new(cluster.dir(), "runs");
    let task = client.submit(runs.task(true)).await.unwrap();
    runs.wait_runs(task.id(), 1).await;
    let pid = runs.wait_pid(task.id()).await.expect("the task runs");

    cluster.cut_worker_links(true);
    let after = client.cancel([&task]).await.unwrap();
    assert_eq!(
        after[0].state,
        TaskState::Running,
        "it ends when its worker says so"
    );
    // Asking again is allowed, changes nothing, and sends the cancel again.
    let again = client.cancel([&task]).await.unwrap();
    assert_eq!(again[0].state, TaskState::Running);
    tokio::time::sleep(Duration::from_millis(500)).await;
    cluster.cut_worker_links(false);

    let done = eventually("the cancelled task to end", WAIT, || {
        let client = client.clone();
        let id = task.id();
        async move {
            let (ready, _) = client.wait([id], 1, Some(Duration::ZERO)).await.ok()?;
            ready.into_iter().next()
        }
    })
    .await;
    assert_eq!(done.state, TaskState::Cancelled, "{done:?}");
    assert_eq!((done.node, done.attempt), (Some(node), 1), "{done:?}");
    assert_eq!(runs.runs(task.id()), vec![(node, 1)], "it never ran again");
    let gone = nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid), None).is_err();
    assert!(gone, "the task's process {pid} was stopped");
}

/// A command task that records its attempts and, from its second attempt on, whether the
/// process of its previous attempt was still alive when it started (an `overlap` file): the
/// property fencing guarantees is that it never is. The first attempt sleeps holding a lock
/// (`flock`) that only its death releases, taken before it records its process; a later
/// attempt that cannot take the lock at once met it alive. (Attempts on two workers live in
/// two PID namespaces, so a pid would not do.)
fn fenced_task(runs: &RunLog) -> Task {
    let script = format!(
        r#"
        echo "$ESCHER_NODE_ID $ESCHER_ATTEMPT" >> "$RUNS/$ESCHER_TASK_ID"
        if [ "$ESCHER_ATTEMPT" != 1 ]; then
            if ! flock -n "$RUNS/$ESCHER_TASK_ID.lock" true; then
                echo "attempt $ESCHER_ATTEMPT met attempt 1 alive" >> "$RUNS/$ESCHER_TASK_ID.overlap"
            fi
            exit 0
        fi
        exec flock "$RUNS/$ESCHER_TASK_ID.lock" sh -c '{} > "$RUNS/$ESCHER_TASK_ID.pid"; exec sleep 600'
    "#,
        procs::RECORD_PID
    );
    Task::command(["sh", "-c", &script])
        .env("RUNS", runs.dir.display().to_string())
        .resources_str("cpu=1")
        .max_retries(1)
}

/// Whether process `pid` is alive (not gone, not a zombie waiting for its parent).
fn alive(pid: i32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .map(|stat| !stat.contains(") Z"))
        .unwrap_or(false)
}

/// How the worker of [`fenced`] is taken away.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Fault {
    /// SIGKILL.
    Kill,
    /// SIGSTOP, past the head's heartbeat timeout.
    Freeze,
    /// Its network to the head cut both ways, the worker still running.
    Partition,
    /// SIGKILL of its fence supervisor alone, then SIGSTOP of the worker past the head's
    /// heartbeat timeout.
    FenceKilledThenFreeze,
}

/// Fencing (docs/DESIGN.md §13): a worker SIGKILLed, SIGSTOPped past the head's heartbeat
/// timeout, or cut off from the head, leaves no task process running when the head retries its
/// tasks elsewhere: every task runs its second attempt on the survivor, and no second attempt
/// ever meets the first one alive.
async fn fenced(fault: Fault) {
    // A node lost after 4 s of silence (a lease of 2 s): on a loaded machine (CI runs this
    // tier beside the environment tier) a worker's heartbeats paused past the 1.2 s this test
    // once had before any fault, the head then retried attempt 1 on that same worker, and the
    // fault killed attempt 2 there (seen in CI: attempt 2 on the victim, exit 137).
    let mut cluster = ProcessCluster::builder()
        .resources("cpu=20,memory=512")
        .heartbeat_timeout_ms(4_000)
        .workers(usize::from(fault != Fault::Partition))
        .start()
        .await;
    let client = cluster.client().await;
    let victim = match fault {
        Fault::Partition => {
            cluster
                .start_worker_behind_proxy("w1", "cpu=20,memory=512")
                .await
        }
        Fault::Kill | Fault::Freeze | Fault::FenceKilledThenFreeze => cluster.node("w1"),
    };
    let runs = RunLog::new(cluster.dir(), "runs");
    let tasks = client
        .submit_batch((0..20).map(|_| fenced_task(&runs)))
        .await
        .unwrap();
    for task in &tasks {
        runs.wait_runs(task.id(), 1).await;
    }
    let mut pids = Vec::with_capacity(tasks.len());
    for task in &tasks {
        pids.push(runs.wait_pid(task.id()).await);
    }
    let survivor = cluster.start_worker("w2", "cpu=20,memory=512").await;
    match fault {
        Fault::Kill => cluster.kill_worker("w1"),
        Fault::Freeze => cluster.freeze_worker("w1", true),
        Fault::Partition => cluster.cut_worker_links(true),
        Fault::FenceKilledThenFreeze => {
            kill_the_fence_alone(&cluster, "w1").await;
            cluster.freeze_worker("w1", true);
        }
    }
    let statuses = wait_all(&client, &tasks).await;
    for task in &tasks {
        let s = &statuses[&task.id()];
        assert_succeeded(s, survivor, 2);
        assert_eq!(runs.runs(task.id()), vec![(victim, 1), (survivor, 2)]);
        let overlap = runs.dir.join(format!("{}.overlap", task.id().0));
        assert!(
            !overlap.exists(),
            "task {} ran twice at once: {}",
            task.id(),
            std::fs::read_to_string(&overlap).unwrap_or_default()
        );
    }
    for pid in pids.into_iter().flatten() {
        assert!(!alive(pid), "the first attempt's process {pid} still runs");
    }
    if fault != Fault::Kill {
        // Thawed or reconnected, the worker finds its node lost and its tasks gone; nothing
        // runs again.
        match fault {
            Fault::Freeze | Fault::FenceKilledThenFreeze => cluster.freeze_worker("w1", false),
            _ => cluster.cut_worker_links(false),
        }
        tokio::time::sleep(Duration::from_secs(2)).await;
        for task in &tasks {
            assert_eq!(runs.runs(task.id()).len(), 2);
        }
    }
    if fault == Fault::FenceKilledThenFreeze {
        // Back, the worker says what became of its fence, and its node shows it.
        cluster
            .wait_status("w1 to show that its fence was restarted", |s| {
                let w1 = s.nodes.iter().find(|n| n.name == "w1" && n.alive)?;
                let report = w1.fence.as_deref()?;
                report
                    .starts_with("restarted 1 time(s): the last supervisor was killed by SIGKILL")
                    .then_some(())
            })
            .await;
    }
}

/// A worker that cannot start another fence supervisor (its binary was removed, as an upgrade
/// might) when its supervisor dies runs nothing unfenced: it SIGKILLs its tasks itself, whose
/// reports say why, takes no new ones (its node drains), stays attached, and its node says that
/// its fence is down.
#[tokio::test]
async fn a_worker_that_cannot_restart_its_fence_stops_its_tasks_and_takes_no_new_ones() {
    cannot_restart_the_fence(|copy| std::fs::remove_file(copy).expect("removing the copy")).await;
}

/// The same with the binary still there but no longer executable (its execute permission
/// taken away): starting another supervisor fails with "permission denied", and the worker
/// stops its tasks and takes no new ones just the same.
#[tokio::test]
async fn a_worker_whose_binary_lost_its_execute_permission_runs_nothing_unfenced() {
    cannot_restart_the_fence(|copy| {
        use std::os::unix::fs::PermissionsExt as _;
        std::fs::set_permissions(copy, std::fs::Permissions::from_mode(0o644))
            .expect("taking the copy's execute permission away")
    })
    .await;
}

/// A worker run from a copy of `escher-worker`, its task running, the copy broken by `breaks`,
/// then its fence supervisor SIGKILLed: what the two tests above check.
async fn cannot_restart_the_fence(breaks: impl FnOnce(&std::path::Path)) {
    let mut cluster = ProcessCluster::builder().workers(0).start().await;
    let copy = cluster.dir().join("escher-worker-copy");
    std::fs::copy(procs::binary("escher-worker"), &copy).expect("a copy of escher-worker");
    cluster.next_workers(procs::WorkerExtra {
        binary: Some(copy.clone()),
        ..procs::WorkerExtra::default()
    });
    let node = cluster.start_worker("w1", "cpu=2,memory=512").await;
    let client = cluster.client().await;
    let runs = RunLog::new(cluster.dir(), "runs");
    let task = client
        .submit(runs.sleeping_task(600).max_retries(0))
        .await
        .unwrap();
    runs.wait_runs(task.id(), 1).await;
    breaks(&copy);
    let fences = cluster.fence_pids("w1");
    assert_eq!(fences.len(), 1, "{fences:?}");
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(fences[0]),
        nix::sys::signal::Signal::SIGKILL,
    )
    .expect("SIGKILL to the fence supervisor");

    let done = client.get(task.id(), Some(WAIT)).await.unwrap();
    assert_eq!(done.state, TaskState::Failed, "{done:?}");
    let reason = done.reason.clone().unwrap_or_default();
    assert!(
        reason.contains("stopped by the fence")
            && reason.contains("another could not be started")
            && reason.contains("takes no new ones"),
        "{done:?}"
    );
    // The node stays, drained (nothing new is placed there), and says why.
    cluster
        .wait_status("w1 to be drained and to say its fence is down", |s| {
            let w1 = s.node(node)?;
            // A drained node offers nothing.
            let drained = w1
                .resource("cpu")
                .is_none_or(|r| r.available() == Some(escher::types::Amount::ZERO));
            let down = w1
                .fence
                .as_deref()?
                .starts_with("down: the fence supervisor was killed by SIGKILL");
            (w1.alive && drained && down).then_some(())
        })
        .await;
    assert!(cluster.fence_pids("w1").is_empty());
    let log = cluster.worker_output("w1");
    assert!(
        log.contains("the worker's tasks can no longer be fenced"),
        "{log}"
    );
}

/// A worker whose binary cannot be executed (no execute permission, as on a file system
/// mounted `noexec`), started anyway through the dynamic loader, cannot run its own binary
/// again as its fence supervisor: it refuses to start at all, before it registers or runs
/// anything, and says why and what to do.
#[tokio::test]
async fn a_worker_whose_fence_supervisor_cannot_start_refuses_to_run() {
    use std::os::unix::fs::PermissionsExt as _;
    // The dynamic loader this test binary was loaded by (the same the worker's binary names).
    let maps = std::fs::read_to_string("/proc/self/maps").expect("/proc/self/maps");
    let loader = maps
        .lines()
        .filter_map(|line| line.split_whitespace().nth(5))
        .find(|path| {
            Path::new(path)
                .file_name()
                .and_then(|n| n.to_str())
                .is_some_and(|n| n.starts_with("ld-") && n.contains(".so"))
        })
        .expect("a dynamically linked test binary names its loader");
    let dir = tempfile::tempdir().unwrap();
    let copy = dir.path().join("escher-worker");
    std::fs::copy(procs::binary("escher-worker"), &copy).expect("a copy of escher-worker");
    std::fs::set_permissions(&copy, std::fs::Permissions::from_mode(0o644)).unwrap();
    let mut child = std::process::Command::new(loader)
        .arg(&copy)
        .args(["--head", "http://127.0.0.1:9", "--state-dir"])
        .arg(dir.path().join("state"))
        .env("ESCHER_HOME", dir.path().join("home"))
        .env_remove("ESCHER_HEAD")
        .env_remove("ESCHER_TOKEN")
        .env_remove("ESCHER_ACCESS_FILE")
        .env_remove("RUST_BACKTRACE")
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("the loader runs");
    let status = eventually("the worker to exit by itself", WAIT, || {
        let status = child.try_wait().expect("waiting on the worker");
        async move { status }
    })
    .await;
    let mut said = String::new();
    std::io::Read::read_to_string(&mut child.stderr.take().unwrap(), &mut said).unwrap();
    assert!(!status.success(), "{status}: {said}");
    assert!(
        said.contains("cannot start the fence supervisor")
            && said.contains("through the dynamic loader")
            && said.contains("runs no task unfenced")
            && said.contains("execute permission"),
        "{said}"
    );
    assert!(
        !dir.path().join("state").join("identity.json").exists(),
        "it registered"
    );
}

/// SIGKILLs the fence supervisor of the worker named `name`, and nothing else, and waits for
/// the worker to have started another (it does at once).
async fn kill_the_fence_alone(cluster: &ProcessCluster, name: &str) {
    let fences = cluster.fence_pids(name);
    assert_eq!(
        fences.len(),
        1,
        "one fence supervisor under {name}: {fences:?}"
    );
    let killed = fences[0];
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(killed),
        nix::sys::signal::Signal::SIGKILL,
    )
    .expect("SIGKILL to the fence supervisor");
    eventually(
        "the worker to start another fence supervisor",
        Duration::from_secs(5),
        || {
            let next = cluster.fence_pids(name);
            async move { next.iter().any(|pid| *pid != killed).then_some(()) }
        },
    )
    .await;
}

/// The fence supervisor killed alone (by hand, or by the OOM killer), then the worker stopped
/// past the head's heartbeat timeout: the worker started another supervisor at once and told
/// it what the dead one held, so the tasks are gone before the head retries them; and the node
/// says that its fence was restarted, and how the last one died.
#[tokio::test]
async fn a_worker_whose_fence_was_killed_still_fences_its_tasks() {
    fenced(Fault::FenceKilledThenFreeze).await;
}

#[tokio::test]
async fn a_killed_workers_tasks_are_gone_before_they_are_retried() {
    fenced(Fault::Kill).await;
}

#[tokio::test]
async fn a_stopped_workers_tasks_are_gone_before_they_are_retried() {
    fenced(Fault::Freeze).await;
}

/// A partition (the worker runs on, the network to the head drops everything both ways): the
/// worker cannot renew its lease, the fence stops its tasks, and only then, a heartbeat timeout
/// after the worker's last heartbeat, does the head retry them.
#[tokio::test]
async fn a_partitioned_workers_tasks_are_gone_before_they_are_retried() {
    fenced(Fault::Partition).await;
}

/// The cgroup that contains a command task measures it too: a task that runs for longer than
/// the worker's sampling interval has its CPU time and memory in its telemetry (reported with
/// the attempt's credential, as `escher report` would), and a short one reports nothing.
#[tokio::test]
async fn a_command_tasks_cgroup_reports_its_cpu_and_memory_as_telemetry() {
    let cluster = ProcessCluster::builder().start().await;
    let client = cluster.client().await;
    // ~48 MB held in a shell variable, then 7 s of forks and a busy loop.
    let script = r#"
        x=$(head -c 48000000 /dev/zero | tr '\0' a)
        end=$(( $(date +%s) + 7 ))
        while [ "$(date +%s)" -lt "$end" ]; do i=0; while [ $i -lt 2000 ]; do i=$((i+1)); done; done
        echo ${#x}
    "#;
    let long = client
        .run(Task::command(["sh", "-c", script]), Some(WAIT))
        .await
        .unwrap();
    assert_eq!(long.state, TaskState::Succeeded, "{long:?}");
    let short = client
        .run(Task::command(["true"]), Some(WAIT))
        .await
        .unwrap();
    let reported = client.telemetry([long.id, short.id], None).await.unwrap();
    let of = |id: TaskId| reported.iter().find(|t| t.task == id);
    let long_use = of(long.id).unwrap_or_else(|| panic!("nothing reported: {reported:?}"));
    let cpu = long_use.latest("escher.cpu_seconds").expect("CPU time");
    assert!(cpu >= 1.0, "{long_use:?}");
    let peak = long_use
        .latest("escher.memory_peak_bytes")
        .expect("the memory peak");
    assert!(peak >= 40e6, "{long_use:?}");
    assert!(
        of(short.id).is_none_or(|t| t.samples.is_empty()),
        "{reported:?}"
    );
}

/// Task processes are contained by a cgroup of their own (DESIGN §13): a process that leaves
/// the task's process group (`setsid`) is killed when the task ends; and `pkill -9
/// escher-worker` (every process of that name) leaves the fence supervisor, which goes by
/// another name, to kill the task's processes, escaped ones included, before the head retries
/// the task elsewhere.
#[tokio::test]
async fn processes_that_leave_their_group_are_fenced_by_the_tasks_cgroup() {
    fenced_by_the_tasks_cgroup("v2").await;
}

/// The same in the cgroup v1 freezer hierarchy, for hosts that mount only cgroup v1 (the CI
/// machines mount v1 controllers beside the unified hierarchy): a kill freezes the cgroup, so
/// that nothing in it forks while its processes are SIGKILLed.
#[tokio::test]
async fn processes_that_leave_their_group_are_fenced_by_a_v1_freezer_cgroup_too() {
    fenced_by_the_tasks_cgroup("v1").await;
}

async fn fenced_by_the_tasks_cgroup(hierarchy: &str) {
    let mut cluster = ProcessCluster::builder().workers(0).start().await;
    // The host's PID namespace: the cgroup alone fences (in a namespace of its own, killing
    // the worker ends the namespace, and its tasks with it, before any cgroup is needed).
    cluster.next_workers(procs::WorkerExtra {
        args: vec![
            "--task-cgroup-hierarchy".into(),
            hierarchy.into(),
            "--no-pid-namespace".into(),
        ],
        ..procs::WorkerExtra::default()
    });
    cluster.start_worker("w1", "cpu=2,memory=512").await;
    let expected = match hierarchy {
        "v1" => "cgroup v1 freezer",
        _ => "cgroup v2",
    };
    let log = cluster.worker_output("w1");
    assert!(
        log.contains("each command task runs in a cgroup of its own") && log.contains(expected),
        "the worker did not say it uses {expected}: {log}"
    );
    let client = cluster.client().await;
    let runs = RunLog::new(cluster.dir(), "runs");
    let escaping = |name: &str, then: &str| escaping_task(&runs, name, then);
    let started = |name: &str| {
        let file = runs.dir.join(format!("{name}.started"));
        async move {
            eventually(&format!("{} to start", file.display()), WAIT, || {
                let there = file.exists();
                async move { there.then_some(()) }
            })
            .await
        }
    };

    // The task ends; what it left behind outside its group goes with it.
    let done = client
        .run(escaping("left", "sleep 0.5"), Some(WAIT))
        .await
        .unwrap();
    assert_eq!(done.state, TaskState::Succeeded, "{done:?}");
    started("left").await;
    let lock = runs.dir.join("left.lock");
    eventually("the escaped process to be killed", WAIT, || {
        let gone = !lock_held(&lock);
        async move { gone.then_some(()) }
    })
    .await;

    // pkill -9 escher-worker: the supervisor survives it and fences the task's cgroup.
    let task = client
        .submit(escaping("killed", "exec sleep 600"))
        .await
        .unwrap();
    started("killed").await;
    let survivor = cluster.start_worker("w2", "cpu=2,memory=512").await;
    let killed = cluster.kill_worker_by_name("w1");
    assert_eq!(
        killed, 1,
        "only the worker goes by its name; the supervisor does not"
    );
    let done = client.get(task.id(), Some(WAIT)).await.unwrap();
    assert_eq!(done.state, TaskState::Succeeded, "{done:?}");
    assert_eq!((done.node, done.attempt), (Some(survivor), 2), "{done:?}");
    let overlap = runs.dir.join("killed.overlap");
    assert!(
        !overlap.exists(),
        "the escaped process of attempt 1 ran beside attempt 2: {}",
        std::fs::read_to_string(&overlap).unwrap_or_default()
    );
    assert!(
        !lock_held(&runs.dir.join("killed.lock")),
        "the escaped process still runs"
    );
}

/// A command task whose first attempt leaves its process group (`setsid`) with a process that
/// holds the lock `RUNS/NAME.lock` while it lives (`NAME.started` once it does), then runs
/// `then`; a later attempt that finds the lock held writes `NAME.overlap`. (A lock, not a
/// pid: the attempts may live in two PID namespaces.)
fn escaping_task(runs: &RunLog, name: &str, then: &str) -> Task {
    let script = format!(
        r#"
        if [ "$ESCHER_ATTEMPT" != 1 ]; then
            if ! flock -n "$RUNS/{name}.lock" true; then
                echo "attempt $ESCHER_ATTEMPT met the escaped process alive" >> "$RUNS/{name}.overlap"
            fi
            exit 0
        fi
        setsid flock "$RUNS/{name}.lock" sh -c 'touch "$RUNS/{name}.started"; exec sleep 600' &
        while [ ! -e "$RUNS/{name}.started" ]; do sleep 0.05; done
        {then}
        "#
    );
    Task::command(["sh", "-c", &script])
        .env("RUNS", runs.dir.display().to_string())
        .resources_str("cpu=1")
        .max_retries(1)
}

/// Whether some process holds the lock at `path` (`flock`, as the tasks take it).
fn lock_held(path: &Path) -> bool {
    !std::process::Command::new("flock")
        .arg("-n")
        .arg(path)
        .arg("true")
        .status()
        .expect("flock (util-linux)")
        .success()
}

/// A worker run as root lives with its tasks in a PID namespace of its own: a kill of every
/// escher process of its host at once (the worker, the namespace's init, the fence
/// supervisor) ends its tasks, one that left its process group included, at once, long before
/// the head retries them elsewhere; the retry meets nothing of the first attempt.
#[tokio::test]
async fn every_escher_process_killed_at_once_ends_the_tasks_with_their_pid_namespace() {
    let mut cluster = ProcessCluster::builder().start().await;
    let log = cluster.worker_output("w1");
    assert!(
        log.contains("run in a PID namespace of their own"),
        "the worker runs as root in CI and so in a PID namespace of its own: {log}"
    );
    let client = cluster.client().await;
    let runs = RunLog::new(cluster.dir(), "runs");
    let task = client
        .submit(escaping_task(&runs, "all", "exec sleep 600"))
        .await
        .unwrap();
    let started = runs.dir.join("all.started");
    eventually("the task to start", WAIT, || {
        let there = started.exists();
        async move { there.then_some(()) }
    })
    .await;
    let survivor = cluster.start_worker("w2", "cpu=2,memory=512").await;
    let killed = cluster.kill_every_escher_process_of("w1");
    assert!(
        killed.iter().any(|n| n == "escher-fence") && killed.iter().any(|n| n == "escher-init"),
        "{killed:?}"
    );
    let lock = runs.dir.join("all.lock");
    let at = std::time::Instant::now();
    while lock_held(&lock) {
        assert!(
            at.elapsed() < Duration::from_secs(2),
            "the escaped process outlived every escher process of its worker"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let done = client.get(task.id(), Some(WAIT)).await.unwrap();
    assert_eq!(done.state, TaskState::Succeeded, "{done:?}");
    assert_eq!((done.node, done.attempt), (Some(survivor), 2), "{done:?}");
    assert!(!runs.dir.join("all.overlap").exists());
}

/// A worker stalled longer than its lease but shorter than the head's heartbeat timeout: the
/// fence has stopped its tasks, its node is not lost, and the task's report says the fence
/// stopped it and why, not "exited with code 137".
#[tokio::test]
async fn a_task_the_fence_stopped_says_so() {
    let mut cluster = ProcessCluster::builder()
        .heartbeat_timeout_ms(8_000)
        .start()
        .await;
    let client = cluster.client().await;
    let runs = RunLog::new(cluster.dir(), "runs");
    let task = client.submit(runs.sleeping_task(600)).await.unwrap();
    runs.wait_runs(task.id(), 1).await;
    cluster.freeze_worker("w1", true);
    // The lease is 4 s; the head waits 8 s.
    tokio::time::sleep(Duration::from_millis(5_500)).await;
    cluster.freeze_worker("w1", false);
    let done = client.get(task.id(), Some(WAIT)).await.unwrap();
    assert_eq!(done.state, TaskState::Failed, "{done:?}");
    let reason = done.reason.clone().unwrap_or_default();
    assert!(
        reason.contains("stopped by the fence") && reason.contains("stalled"),
        "{done:?}"
    );
    assert_eq!(done.attempt, 1, "{done:?}");
    let status = cluster.status().await;
    assert!(
        status.nodes.iter().any(|n| n.name == "w1" && n.alive),
        "the node was not lost: {status:?}"
    );
}

/// Logs are per attempt, and outlive their worker: each attempt's output is read by its
/// number; once the worker that ran a task is gone, the head serves the last 4 KiB of the
/// output it kept, and says what was lost.
#[tokio::test]
async fn each_attempts_logs_are_kept_and_their_tail_outlives_the_worker() {
    let mut cluster = ProcessCluster::builder()
        .resources("cpu=2,memory=512")
        .start()
        .await;
    let client = cluster.client().await;
    // Attempt 1 fails, attempt 2 succeeds; each says which it is.
    let retried = Task::command([
        "sh",
        "-c",
        r#"echo "attempt $ESCHER_ATTEMPT"; [ "$ESCHER_ATTEMPT" = 2 ]"#,
    ])
    .max_retries(1);
    // 5,000 bytes, more than the head keeps, then a last line.
    let long = Task::command(["sh", "-c", "head -c 5000 /dev/zero | tr '\\0' a; echo END"]);
    let tasks = client.submit_batch([retried, long]).await.unwrap();
    let statuses = wait_all(&client, &tasks).await;
    let (retried, long) = (tasks[0].id(), tasks[1].id());
    assert_eq!(statuses[&retried].attempt, 2, "{:?}", statuses[&retried]);
    assert_eq!(statuses[&long].state, TaskState::Succeeded);

    let read = |task: TaskId, attempt: Option<u32>| {
        let client = client.clone();
        async move {
            let reader = client.log_reader(task, escher::types::LogStream::Stdout);
            let mut reader = match attempt {
                Some(n) => reader.attempt(n),
                None => reader,
            };
            let bytes = reader.read_available().await;
            (bytes, reader.notice().map(str::to_owned))
        }
    };
    let (first, _) = read(retried, Some(1)).await;
    assert_eq!(first.unwrap(), b"attempt 1\n");
    let (latest, _) = read(retried, None).await;
    assert_eq!(latest.unwrap(), b"attempt 2\n");
    let (none, _) = read(retried, Some(3)).await;
    let err = none.unwrap_err().to_string();
    assert!(err.contains("there is no attempt 3"), "{err}");
    let (whole, notice) = read(long, None).await;
    assert_eq!(whole.unwrap().len(), 5004);
    assert_eq!(notice, None, "the worker served it whole");

    // The worker goes; the head still has the end of each attempt's output.
    let victim = cluster.node("w1");
    cluster.kill_worker("w1");
    cluster
        .wait_status("the killed worker's node to be declared lost", |s| {
            s.node(victim).filter(|n| !n.alive).cloned()
        })
        .await;
    let (tail, notice) = read(long, None).await;
    let tail = tail.unwrap();
    assert_eq!(tail.len(), 4096);
    assert!(tail.ends_with(b"aaaaEND\n".as_slice()));
    let notice = notice.expect("a notice that the head's tail was read");
    assert!(notice.contains("not connected"), "{notice}");
    assert!(
        notice.contains("bytes 0..908 of its 5004 are lost"),
        "{notice}"
    );
    let (first, notice) = read(retried, Some(1)).await;
    assert_eq!(first.unwrap(), b"attempt 1\n");
    assert!(notice.is_some_and(|n| !n.contains("lost")));
}
