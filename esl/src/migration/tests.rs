//! Unit tests of the [`Migrator`] against the in-memory cluster: placement, migration when
//! room appears, byte-identical relaunches, and jobs that are already together.

use std::sync::{Arc, Mutex};

use super::*;
use crate::policy::testing::task;
use crate::{InMemoryCluster, Mode};

/// A task id and its spec's bytes as submitted.
type Submitted = (TaskId, Vec<u8>);

/// The in-memory cluster, recording every spec submitted through it (as bytes).
#[derive(Debug, Clone)]
struct Recording {
    inner: InMemoryCluster,
    submitted: Arc<Mutex<Vec<Submitted>>>,
}

impl ClusterApi for Recording {
    fn inner(&self) -> &impl ClusterApi {
        &self.inner
    }
    async fn submit(&self, tasks: Vec<TaskSpec>) -> Result<Vec<TaskId>, EslError> {
        let bytes: Vec<Vec<u8>> = tasks
            .iter()
            .map(|t| escher_proto::codec::encode(t).expect("a spec encodes"))
            .collect();
        let ids = self.inner.submit(tasks).await?;
        self.submitted
            .lock()
            .unwrap()
            .extend(ids.iter().copied().zip(bytes));
        Ok(ids)
    }
}

fn capacity(status: &ClusterStatus, node: NodeId, name: &str) -> Option<Capacity> {
    status
        .node(node)?
        .resource(name)
        .map(|r| r.total)
        .filter(|c| !c.is_zero())
}

#[tokio::test]
async fn a_spread_job_moves_to_one_node_with_unchanged_requests() {
    let inner = InMemoryCluster::new(Mode::Manual);
    let n0 = inner.add_node("cpu=4");
    let n1 = inner.add_node("cpu=4");
    let cluster = Recording {
        inner: inner.clone(),
        submitted: Arc::default(),
    };
    // Blockers: 2 cpus busy on each node, so the 4-task job cannot fit on one.
    let blockers = inner
        .submit(vec![
            task("cpu=2", &ResourceSpec::new()),
            task("cpu=2", &ResourceSpec::new()),
        ])
        .await
        .unwrap();
    assert_ne!(inner.node_of(blockers[0]), inner.node_of(blockers[1]));

    let checkpoints = Arc::new(Mutex::new(Vec::new()));
    let seen = checkpoints.clone();
    let probe = inner.clone();
    let mut migrator = Migrator::new(cluster.clone()).on_checkpoint(move |job: &Job| {
        // Called before the job is stopped: its tasks still run.
        let running = job
            .tasks
            .iter()
            .filter(|t| probe.running().iter().any(|(r, _)| r == *t))
            .count();
        seen.lock().unwrap().push((job.id.clone(), running));
    });
    let job = migrator
        .launch("train", vec![task("cpu=1", &ResourceSpec::new()); 4])
        .await
        .unwrap()
        .clone();
    assert_eq!(
        job.placement,
        BTreeMap::from([(n0, 2), (n1, 2)]),
        "spread 2 + 2"
    );
    let mut homes: Vec<NodeId> = job
        .tasks
        .iter()
        .map(|t| inner.node_of(*t).unwrap())
        .collect();
    homes.sort();
    assert_eq!(homes, vec![n0, n0, n1, n1]);
    assert_eq!(
        migrator.maybe_migrate("train").await.unwrap(),
        None,
        "no node has room yet"
    );
    assert!(checkpoints.lock().unwrap().is_empty());

    // The blocker on n1 ends: n1 has 2 free + the job's own 2 = room for all 4.
    let on_n1 = if inner.node_of(blockers[0]) == Some(n1) {
        blockers[0]
    } else {
        blockers[1]
    };
    inner.finish(on_n1, true);
    let moved = migrator
        .maybe_migrate("train")
        .await
        .unwrap()
        .expect("it moves");
    assert_eq!((moved.from.clone(), moved.to), (vec![n0, n1], n1));
    assert_eq!(*checkpoints.lock().unwrap(), vec![("train".to_string(), 4)]);

    // All four run together on n1, the job resource lives only there, the old tasks ended.
    for t in &moved.relaunched {
        assert_eq!(inner.node_of(*t), Some(n1));
        assert_eq!(inner.status(*t).await.unwrap().state, TaskState::Running);
    }
    for t in &job.tasks {
        assert_eq!(inner.status(*t).await.unwrap().state, TaskState::Cancelled);
    }
    let status = inner.cluster_status().await.unwrap();
    assert_eq!(
        capacity(&status, n1, "job-train"),
        Some(Capacity::Finite(Amount::units(4).unwrap()))
    );
    assert_eq!(capacity(&status, n0, "job-train"), None);

    // Byte-identical requests: each relaunch submitted exactly the original spec.
    let submitted = cluster.submitted.lock().unwrap().clone();
    let bytes = |id: TaskId| submitted.iter().find(|(t, _)| *t == id).unwrap().1.clone();
    for (old, new) in job.tasks.iter().zip(&moved.relaunched) {
        assert_eq!(bytes(*old), bytes(*new));
    }
    let after = migrator.job("train").unwrap();
    assert_eq!((after.migrations, after.placement.len()), (1, 1));
    assert_eq!(
        migrator.maybe_migrate("train").await.unwrap(),
        None,
        "already together"
    );
}

#[tokio::test]
async fn a_job_that_fits_starts_together_and_finished_tasks_stay_finished() {
    let inner = InMemoryCluster::new(Mode::Manual);
    let n0 = inner.add_node("cpu=2");
    let n1 = inner.add_node("cpu=4");
    let mut m = Migrator::new(inner.clone());
    let small = vec![task("cpu=1", &ResourceSpec::new()); 3];
    let job = m.launch("small", small).await.unwrap().clone();
    assert_eq!(
        job.placement,
        BTreeMap::from([(n1, 3)]),
        "the first node with room for all"
    );
    assert!(job.tasks.iter().all(|t| inner.node_of(*t) == Some(n1)));
    assert_eq!(m.maybe_migrate("small").await.unwrap(), None);

    // An explicit spread placement: 2 on n0, 1 on n1 (n1 has 1 cpu left).
    let tasks = vec![task("cpu=1", &ResourceSpec::new()); 3];
    let spread = m
        .place("b", tasks, BTreeMap::from([(n0, 2), (n1, 1)]))
        .await
        .unwrap()
        .clone();
    let done = spread
        .tasks
        .iter()
        .copied()
        .find(|t| inner.node_of(*t) == Some(n0))
        .unwrap();
    inner.finish(done, true);
    // n0: 1 free + 1 held = room for the 2 unfinished tasks; only those move.
    let moved = m
        .maybe_migrate("b")
        .await
        .unwrap()
        .expect("n0 has room now");
    assert_eq!(moved.to, n0);
    assert_eq!(moved.relaunched.len(), 2);
    assert!(
        moved
            .relaunched
            .iter()
            .all(|t| inner.node_of(*t) == Some(n0))
    );
    assert_eq!(
        inner.status(done).await.unwrap().state,
        TaskState::Succeeded
    );
    let b = m.job("b").unwrap();
    assert!(b.tasks.contains(&done), "the finished task keeps its id");
}

#[tokio::test]
async fn a_job_already_together_is_not_moved_but_its_resource_shrinks() {
    let inner = InMemoryCluster::new(Mode::Manual);
    let n0 = inner.add_node("cpu=2");
    let n1 = inner.add_node("cpu=2");
    let mut m = Migrator::new(inner.clone()).on_checkpoint(|_| panic!("nothing to checkpoint"));
    let tasks = vec![task("cpu=1", &ResourceSpec::new()); 2];
    let job = m
        .place("c", tasks, BTreeMap::from([(n0, 1), (n1, 1)]))
        .await
        .unwrap()
        .clone();
    let on_n0 = job
        .tasks
        .iter()
        .copied()
        .find(|t| inner.node_of(*t) == Some(n0))
        .unwrap();
    let on_n1 = job
        .tasks
        .iter()
        .copied()
        .find(|t| inner.node_of(*t) == Some(n1))
        .unwrap();
    inner.finish(on_n0, true);
    assert_eq!(m.maybe_migrate("c").await.unwrap(), None);
    assert_eq!(
        inner.status(on_n1).await.unwrap().state,
        TaskState::Running,
        "not restarted"
    );
    assert_eq!(m.job("c").unwrap().placement, BTreeMap::from([(n1, 1)]));
    let status = inner.cluster_status().await.unwrap();
    assert_eq!(capacity(&status, n0, "job-c"), None);
}

#[tokio::test]
async fn unknown_jobs_and_impossible_launches_are_refused() {
    let inner = InMemoryCluster::new(Mode::Manual);
    inner.add_node("cpu=1");
    let mut m = Migrator::new(inner.clone());
    assert!(m.maybe_migrate("nope").await.is_err());
    let err = m
        .launch("big", vec![task("cpu=2", &ResourceSpec::new())])
        .await
        .unwrap_err();
    assert!(err.to_string().contains("cpu=2"), "{err}");
}
