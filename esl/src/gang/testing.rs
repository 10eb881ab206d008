//! Scenarios shared by the unit tests of the three gang designs, on an [`InMemoryCluster`]
//! whose simulated workers finish ordinary tasks at once and keep ghosts until cancelled.
//! Tests run on paused tokio time, so timeouts and back-offs are virtual and deterministic.

use std::sync::Arc;
use std::time::Duration;

use escher_proto::types::{ResourceSet, TaskSpec, TaskState};

use super::{GangRequest, GangScheduler};
use crate::{ClusterApi, EslError, InMemoryCluster, Mode};

/// The bound on a whole scenario, in virtual time.
pub(crate) const LIMIT: Duration = Duration::from_secs(600);

pub(crate) fn set(s: &str) -> ResourceSet {
    s.parse().expect("a valid resource set")
}

/// `nodes` nodes with `resources` each, running ordinary tasks instantly.
pub(crate) fn cluster(nodes: usize, resources: &str) -> InMemoryCluster {
    let cluster = InMemoryCluster::new(Mode::Instant);
    for _ in 0..nodes {
        cluster.add_node(resources);
    }
    cluster
}

pub(crate) fn gang(name: &str, bundles: &[&str]) -> GangRequest {
    GangRequest::new(name, bundles.iter().map(|b| set(b)).collect()).expect("a valid gang")
}

/// A function task with this spec and nothing else.
pub(crate) fn member(spec: &crate::ResourceSpec) -> TaskSpec {
    spec.apply(escher_client::Task::function("work", Vec::new()))
        .build()
        .expect("a valid task")
}

/// Every application resource on any node, and cpu in use per node.
pub(crate) async fn leftovers(cluster: &InMemoryCluster) -> (Vec<String>, Vec<String>) {
    let status = cluster.cluster_status().await.expect("status");
    let mut names = Vec::new();
    let mut cpu = Vec::new();
    for node in &status.nodes {
        for r in &node.resources {
            if !r.name.is_physical() {
                names.push(format!("{}@{}", r.name, node.id));
            }
        }
        cpu.push(
            node.resource("cpu")
                .map(|r| r.used.to_string())
                .unwrap_or_default(),
        );
    }
    (names, cpu)
}

/// Fails unless no gang resource is left and no cpu is in use.
pub(crate) async fn assert_clean(cluster: &InMemoryCluster) {
    let (names, cpu) = leftovers(cluster).await;
    assert!(names.is_empty(), "gang resources left behind: {names:?}");
    assert!(cpu.iter().all(|c| c == "0"), "cpu still held: {cpu:?}");
    let status = cluster.cluster_status().await.unwrap();
    assert_eq!((status.pending_tasks, status.running_tasks), (0, 0));
}

/// One application: acquire the gang, check it is held whole, run one member per bundle
/// inside it, work for `work`, release.
pub(crate) async fn app<S: GangScheduler>(
    scheduler: &S,
    cluster: &InMemoryCluster,
    req: &GangRequest,
    work: Duration,
) -> Result<(), EslError> {
    let gang = scheduler.acquire(req).await?;
    for holder in gang.holders() {
        let state = cluster.status(*holder).await?.state;
        assert_eq!(
            state,
            TaskState::Running,
            "{} granted partially",
            req.name()
        );
    }
    let members: Vec<TaskSpec> = gang.members().iter().map(member).collect();
    let ids = cluster.submit(members).await?;
    let done = cluster
        .wait(ids.clone(), ids.len(), Duration::from_secs(1))
        .await?;
    assert!(
        done.iter().all(|s| s.state == TaskState::Succeeded),
        "members of {} did not all run inside it: {done:?}",
        req.name()
    );
    tokio::time::sleep(work).await;
    scheduler.release(gang).await
}

/// Gangs of three bundles with mixed shapes, more than 3 nodes x cpu=4 hold at once; the
/// shapes differ so that naive ghosts can hold parts of several gangs at once.
pub(crate) fn competing_gangs() -> Vec<GangRequest> {
    let shapes: [&[&str]; 3] = [
        &["cpu=4", "cpu=4", "cpu=4"],
        &["cpu=2", "cpu=2", "cpu=2"],
        &["cpu=3", "cpu=1", "cpu=4"],
    ];
    (0..6)
        .map(|i| gang(&format!("gang-{i}"), shapes[i % shapes.len()]))
        .collect()
}

/// Runs one application per gang of [`competing_gangs`] at once, each with the scheduler
/// `make(i)` gives it; every one must complete, and nothing may be left behind.
pub(crate) async fn all_complete<S, F>(cluster: &InMemoryCluster, make: F)
where
    S: GangScheduler + 'static,
    F: Fn(usize) -> Arc<S>,
{
    let mut apps = tokio::task::JoinSet::new();
    for (i, req) in competing_gangs().into_iter().enumerate() {
        let scheduler = make(i);
        let cluster = cluster.clone();
        apps.spawn(async move {
            let work = Duration::from_millis(30 + 10 * i as u64);
            app(scheduler.as_ref(), &cluster, &req, work).await
        });
    }
    let joined = tokio::time::timeout(LIMIT, async {
        let mut outcomes = Vec::new();
        while let Some(out) = apps.join_next().await {
            outcomes.push(out.expect("the application did not panic"));
        }
        outcomes
    })
    .await
    .expect("every application completes");
    for out in joined {
        out.expect("every gang is eventually held");
    }
    assert_clean(cluster).await;
}

/// A ghost that holds `resources` until cancelled: something else using the cluster.
pub(crate) async fn blocker(
    cluster: &InMemoryCluster,
    resources: &str,
) -> escher_proto::types::TaskId {
    let spec = TaskSpec {
        name: "blocker".into(),
        kind: escher_proto::types::TaskKind::Ghost {
            creates: Vec::new(),
            ttl: None,
        },
        resources: set(resources),
        labels: Default::default(),
        max_retries: 0,
        timeout: None,
        pending_deadline: None,
        on_start: Vec::new(),
        on_success: Vec::new(),
    };
    cluster.submit(vec![spec]).await.expect("submit")[0]
}
