//! LibSpace gang scheduling: a shared service that serializes gang requests (thesis §4.4.2,
//! the second design of Fig. 4.8).
//!
//! ```text
//!  app A ──┐  GangCoordinator (cloneable handle)
//!  app B ──┼──► mpsc queue ──► service task: for each request, in arrival order:
//!  app C ──┘                      submit one ghost per bundle
//!                                 wait until every ghost runs (no timeout race)
//!                                 answer the requester ◄── oneshot
//! ```
//!
//! The service owns the queue and works on one request at a time: it submits the gang's
//! ghosts and waits until every one of them runs before it even looks at the next request.
//! Releasing a gang does not go through the queue (it only frees resources, which can only
//! help the gang in progress).
//!
//! # Why it cannot live-lock (nor deadlock)
//!
//! A deadlock needs two gangs that each hold part of what they need while waiting for the
//! rest. Here at most one gang, the one in progress, holds part of its bundles; every other
//! gang of the service holds all of its bundles (it was granted, and will run and release) or
//! none (it waits in the queue). So the gang in progress never waits for another partial gang:
//! it waits only for resources that granted gangs and ordinary tasks release as they finish,
//! and the scheduler's liveness guarantee places its remaining ghosts once they are free.
//! With no deadlock to break, no timeout is needed, so there is no rollback-and-retry race
//! between applications and nothing to live-lock. The price is latency: a gang waits for every
//! gang ahead of it in the queue (the thesis' "higher minimum latency"), and one gang that can
//! never be placed would block the queue, which [`CoordinatorConfig::max_wait`] bounds (that
//! deadline rolls back one gang at a time, so it cannot start a live-lock either). The argument
//! needs every gang of the cluster to go through one coordinator; gangs placed by other means
//! are ordinary tasks to it.
//!
//! The service stops when the last handle is dropped, after the request in progress.

use std::time::Duration;

use tokio::sync::{mpsc, oneshot};

use super::hold::{self, Held};
use super::{Gang, GangRequest, GangScheduler};
use crate::{ClusterApi, EslError};

/// How the LibSpace service behaves.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CoordinatorConfig {
    /// Give up on a gang (roll it back, answer [`EslError::Timeout`]) after it waited this
    /// long to be fully placed; `None` waits for ever.
    pub max_wait: Option<Duration>,
    /// How many requests may wait in the queue before `acquire` waits for room.
    pub queue: usize,
}

impl Default for CoordinatorConfig {
    fn default() -> CoordinatorConfig {
        CoordinatorConfig {
            max_wait: None,
            queue: 1024,
        }
    }
}

/// One gang request in the queue, with where to send the answer.
#[derive(Debug)]
struct Job {
    request: GangRequest,
    reply: oneshot::Sender<Result<Gang, EslError>>,
}

/// A handle to the shared gang service. Cheap to clone: give one to every application.
#[derive(Debug, Clone)]
pub struct GangCoordinator<C> {
    cluster: C,
    jobs: mpsc::Sender<Job>,
}

impl<C: ClusterApi> GangCoordinator<C> {
    /// Starts the service on the current tokio runtime (call it inside one); it runs until
    /// the last handle is dropped.
    pub fn spawn(cluster: C, config: CoordinatorConfig) -> GangCoordinator<C> {
        let (jobs, queue) = mpsc::channel(config.queue.max(1));
        tokio::spawn(serve(cluster.clone(), config, queue));
        GangCoordinator { cluster, jobs }
    }
}

/// The service: one gang at a time, in arrival order.
async fn serve<C: ClusterApi>(
    cluster: C,
    config: CoordinatorConfig,
    mut queue: mpsc::Receiver<Job>,
) {
    while let Some(mut job) = queue.recv().await {
        if job.reply.is_closed() {
            continue; // the requester went away while queued
        }
        let placed = place(&cluster, &config, &mut job).await;
        if let Err(Ok(gang)) = job.reply.send(placed) {
            // Placed for a requester that went away meanwhile: give it back.
            let _ = hold::release(&cluster, &gang).await;
        }
    }
}

/// Places one gang: submits its ghosts and waits until all run, or until the requester goes
/// away or `max_wait` passes (then rolls back).
async fn place<C: ClusterApi>(
    cluster: &C,
    config: &CoordinatorConfig,
    job: &mut Job,
) -> Result<Gang, EslError> {
    let req = &job.request;
    hold::prepare(cluster, req).await?;
    let ghosts = match cluster.submit(hold::ghosts(req, None)?).await {
        Ok(ghosts) => ghosts,
        Err(e) => {
            let _ = hold::unprepare(cluster, req).await;
            return Err(e);
        }
    };
    let held = tokio::select! {
        held = hold::await_running(cluster, &ghosts, config.max_wait) => held,
        () = job.reply.closed() => Ok(Held::TimedOut),
    };
    if let Ok(Held::All) = held {
        return Ok(Gang::new(req, ghosts));
    }
    hold::rollback(cluster, &ghosts).await?;
    hold::unprepare(cluster, req).await?;
    match held? {
        Held::Ended(status) => Err(EslError::Unsatisfiable(format!(
            "ghost {} of gang {} ended while waiting: {}",
            status.id,
            req.name(),
            status.reason.unwrap_or_else(|| status.state.to_string())
        ))),
        _ => Err(EslError::Timeout {
            what: format!(
                "gang {} (all {} bundles held)",
                req.name(),
                req.bundles().len()
            ),
            after: config.max_wait.unwrap_or_default(),
        }),
    }
}

impl<C: ClusterApi> GangScheduler for GangCoordinator<C> {
    async fn acquire(&self, req: &GangRequest) -> Result<Gang, EslError> {
        let stopped = || EslError::Refused("the gang coordinator has stopped".into());
        let (reply, answer) = oneshot::channel();
        let job = Job {
            request: req.clone(),
            reply,
        };
        self.jobs.send(job).await.map_err(|_| stopped())?;
        answer.await.map_err(|_| stopped())?
    }

    async fn release(&self, gang: Gang) -> Result<(), EslError> {
        hold::release(&self.cluster, &gang).await
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;
    use crate::gang::testing::{
        all_complete, app, assert_clean, blocker, cluster, competing_gangs, gang, leftovers,
    };

    #[tokio::test(start_paused = true)]
    async fn requests_are_served_one_gang_at_a_time() {
        let cluster = cluster(3, "cpu=4");
        let other = blocker(&cluster, "cpu=2").await;
        let coordinator = GangCoordinator::spawn(cluster.clone(), CoordinatorConfig::default());
        let big = gang("big", &["cpu=4", "cpu=4", "cpu=4"]);
        let small = gang("small", &["cpu=1", "cpu=1"]);
        let first = tokio::spawn({
            let (c, req) = (coordinator.clone(), big.clone());
            async move { c.acquire(&req).await }
        });
        tokio::time::sleep(Duration::from_millis(10)).await;
        let second = tokio::spawn({
            let (c, req) = (coordinator.clone(), small.clone());
            async move { c.acquire(&req).await }
        });
        tokio::time::sleep(Duration::from_secs(5)).await;
        // `big` holds two bundles and waits for the blocker's node; `small` would fit in the
        // blocker's node now, but its ghosts are not even submitted while `big` is in progress.
        assert!(!first.is_finished() && !second.is_finished());
        let status = cluster.cluster_status().await.unwrap();
        assert_eq!((status.running_tasks, status.pending_tasks), (3, 1));

        cluster.cancel(vec![other]).await.unwrap();
        let held = first.await.unwrap().unwrap();
        tokio::time::sleep(Duration::from_secs(1)).await;
        assert!(!second.is_finished(), "`small` waits for `big`'s bundles");
        coordinator.release(held).await.unwrap();
        let held = second.await.unwrap().unwrap();
        coordinator.release(held).await.unwrap();
        assert_clean(&cluster).await;
    }

    #[tokio::test(start_paused = true)]
    async fn competing_gangs_all_complete_without_any_rollback() {
        let cluster = cluster(3, "cpu=4");
        let coordinator = Arc::new(GangCoordinator::spawn(
            cluster.clone(),
            CoordinatorConfig::default(),
        ));
        all_complete(&cluster, |_| coordinator.clone()).await;
        let bundles: usize = competing_gangs().iter().map(|g| g.bundles().len()).sum();
        assert_eq!(
            cluster.dispatches().len(),
            2 * bundles,
            "every ghost and every member ran exactly once: nothing was rolled back"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn a_gang_that_waits_too_long_or_is_abandoned_is_rolled_back() {
        let cluster = cluster(3, "cpu=4");
        let other = blocker(&cluster, "cpu=4").await;
        let config = CoordinatorConfig {
            max_wait: Some(Duration::from_millis(200)),
            ..CoordinatorConfig::default()
        };
        let coordinator = GangCoordinator::spawn(cluster.clone(), config);
        let big = gang("big", &["cpu=4", "cpu=4", "cpu=4"]);
        let err = coordinator.acquire(&big).await.unwrap_err();
        assert!(matches!(err, EslError::Timeout { .. }), "{err}");
        let (names, mut cpu) = leftovers(&cluster).await;
        cpu.sort();
        assert!(names.is_empty(), "{names:?}");
        assert_eq!(cpu, ["0", "0", "4"], "only the blocker holds anything");

        // A requester that gives up while its gang is in progress: rolled back, next served.
        let patient = GangCoordinator::spawn(cluster.clone(), CoordinatorConfig::default());
        let gave_up = tokio::time::timeout(Duration::from_millis(100), patient.acquire(&big)).await;
        assert!(gave_up.is_err());
        cluster.cancel(vec![other]).await.unwrap();
        app(
            &patient,
            &cluster,
            &gang("next", &["cpu=4"]),
            Duration::ZERO,
        )
        .await
        .unwrap();
        assert_clean(&cluster).await;
    }
}
