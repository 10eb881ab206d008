//! Fair share over time (`escher::esl::fair_time`) on real `escher-head` and `escher-worker`
//! processes: two namespaces, one with heavy past usage, are admitted by their decayed usage;
//! a high-priority job preempts over-share work gracefully (the preempted task sees SIGTERM and
//! ends inside the worker's grace period), the preempted job is requeued once and runs again
//! under a new task once there is room.

mod procs;

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use escher::esl::FairTime;
use escher::esl::fair_time::{Decision, FairTimeConfig, HalfLife, JobState, Namespace, OnPreempt};
use escher::types::{TaskSpec, TaskState};
use escher::{Client, Task};
use procs::{ProcessCluster, WAIT, eventually};

fn now_ms() -> u64 {
    u64::try_from(
        SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .unwrap()
            .as_millis(),
    )
    .unwrap()
}

fn sleeper(name: &str, secs: u32) -> TaskSpec {
    Task::command(["sleep", &secs.to_string()])
        .name(name)
        .resources_str("cpu=1")
        .build()
        .unwrap()
}

/// Rounds every 100 ms until `done` holds of the policy; the decisions carried out meanwhile.
async fn rounds_until(
    policy: &FairTime<Client>,
    what: &str,
    done: impl Fn(&FairTime<Client>) -> bool,
) -> Vec<Decision> {
    let mut decisions = Vec::new();
    let deadline = tokio::time::Instant::now() + WAIT;
    while !done(policy) {
        assert!(
            tokio::time::Instant::now() < deadline,
            "{what}: not within {WAIT:?}"
        );
        decisions.extend(policy.round(now_ms()).await.expect("a round"));
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    decisions
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn namespaces_are_admitted_by_their_decayed_usage() {
    let cluster = ProcessCluster::builder()
        .resources("cpu=2,memory=512")
        .start()
        .await;
    let client = cluster.client().await;
    let config = FairTimeConfig::new(HalfLife::from_secs(3600.0).unwrap())
        .namespace(Namespace::new("heavy"))
        .unwrap()
        .namespace(Namespace::new("light"))
        .unwrap();
    let policy = FairTime::new(client.clone(), config).await.unwrap();
    // Yesterday's thousand CPU-hours, half a life ago: still most of the cluster's usage.
    policy
        .record_usage("heavy", 3_600_000.0, now_ms() - 1_800_000)
        .unwrap();
    let heavy: Vec<_> = (0..2)
        .map(|i| {
            let spec = sleeper(&format!("heavy-{i}"), 60);
            policy
                .submit("heavy", spec, None, OnPreempt::Requeue)
                .unwrap()
        })
        .collect();
    let light: Vec<_> = (0..2)
        .map(|i| {
            let spec = sleeper(&format!("light-{i}"), 60);
            policy
                .submit("light", spec, None, OnPreempt::Requeue)
                .unwrap()
        })
        .collect();

    // A round reads the cluster's capacity from the head's status, where a worker that has
    // registered shows its resources only once its stream has attached: until then the round
    // sees no CPU and admits nothing (it once admitted all four here, when a resource no node
    // had counted as unlimited).
    cluster
        .wait_status("the worker's CPUs in the head's status", |s| {
            s.nodes
                .iter()
                .any(|n| n.alive && n.resources.iter().any(|r| r.name.as_str() == "cpu"))
                .then_some(())
        })
        .await;
    let decisions = policy.round(now_ms()).await.unwrap();
    // What the head said just after the round read it, for a failure's message.
    let nodes: Vec<_> = client
        .cluster_status()
        .await
        .map(|s| {
            s.nodes
                .into_iter()
                .map(|n| (n.id, n.alive, n.resources))
                .collect()
        })
        .unwrap_or_default();
    let admitted: Vec<_> = decisions
        .iter()
        .filter_map(|d| match d {
            Decision::Admit { job, .. } => Some(*job),
            _ => None,
        })
        .collect();
    assert_eq!(
        admitted, light,
        "the light namespace goes first: {decisions:?}; the nodes after the round: {nodes:?}"
    );
    for job in &heavy {
        assert_eq!(policy.state(*job).unwrap(), JobState::Waiting);
    }
    // The head runs what the policy admitted, on the real worker.
    for job in &light {
        let task = policy.task_of(*job).expect("submitted");
        eventually(&format!("task {task} to run"), WAIT, || {
            let client = client.clone();
            async move {
                let status = client.task_info(task).await.ok()?.status;
                (status.state == TaskState::Running).then_some(())
            }
        })
        .await;
    }
    let shares = policy.shares(now_ms());
    let factor = |ns: &str| shares.iter().find(|s| s.namespace == ns).unwrap().factor;
    assert!(factor("heavy") < factor("light"), "{shares:?}");

    for job in light {
        client.cancel([policy.task_of(job).unwrap()]).await.unwrap();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_high_priority_job_preempts_gracefully_and_the_preempted_job_is_requeued_once() {
    let cluster = ProcessCluster::builder()
        .resources("cpu=1,memory=512")
        .start()
        .await;
    let client = cluster.client().await;
    let config = FairTimeConfig::new(HalfLife::from_secs(600.0).unwrap())
        .namespace(Namespace::new("batch"))
        .unwrap()
        .namespace(Namespace::new("prod").priority(10))
        .unwrap();
    let policy = FairTime::new(client.clone(), config).await.unwrap();

    // A batch job that says when it is told to stop, then stops.
    let told = cluster.shared_path("batch-told");
    let script = format!(
        "trap 'echo SIGTERM >> {told}; exit 143' TERM; echo started; \
         while true; do sleep 0.1; done",
        told = told.display()
    );
    let batch_spec = Task::command(["sh", "-c", &script])
        .name("batch")
        .resources_str("cpu=1")
        .build()
        .unwrap();
    let batch = policy
        .submit("batch", batch_spec, None, OnPreempt::Requeue)
        .unwrap();
    rounds_until(&policy, "the batch job admitted", |p| {
        p.task_of(batch).is_some()
    })
    .await;
    let first = policy.task_of(batch).unwrap();
    eventually("the batch task to run", WAIT, || {
        let client = client.clone();
        async move {
            let status = client.task_info(first).await.ok()?.status;
            (status.state == TaskState::Running).then_some(())
        }
    })
    .await;

    // A production job arrives: the cluster is full, so the batch job makes room.
    let prod = policy
        .submit("prod", sleeper("prod", 1), None, OnPreempt::Fail)
        .unwrap();
    let decisions = rounds_until(&policy, "the prod job admitted", |p| {
        p.task_of(prod).is_some()
    })
    .await;
    assert!(
        decisions
            .iter()
            .any(|d| matches!(d, Decision::Preempt { job, .. } if *job == batch)),
        "{decisions:?}"
    );
    let stopped = client.get(first, Some(WAIT)).await.unwrap();
    assert_eq!(stopped.state, TaskState::Cancelled, "{stopped:?}");
    let said = std::fs::read_to_string(&told).unwrap_or_default();
    assert_eq!(said.trim(), "SIGTERM", "the task was told, once");
    assert_eq!(policy.preemptions(batch), 1);
    assert_eq!(policy.state(batch).unwrap(), JobState::Waiting, "requeued");

    // Once the production job ends, the batch job runs again, as a new task.
    rounds_until(&policy, "the batch job admitted again", |p| {
        p.task_of(batch).is_some_and(|t| t != first)
    })
    .await;
    let second = policy.task_of(batch).unwrap();
    let prod_task = policy.task_of(prod).unwrap();
    let prod_status = client.get(prod_task, Some(WAIT)).await.unwrap();
    assert_eq!(prod_status.state, TaskState::Succeeded, "{prod_status:?}");
    eventually("the batch job's second task to run", WAIT, || {
        let client = client.clone();
        async move {
            let status = client.task_info(second).await.ok()?.status;
            (status.state == TaskState::Running).then_some(())
        }
    })
    .await;
    assert_eq!(policy.preemptions(batch), 1, "requeued once, not again");
    client.cancel([second]).await.unwrap();
}
