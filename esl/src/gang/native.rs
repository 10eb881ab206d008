//! FrameSpace gang scheduling: the head's own atomic reservations (thesis §4.6.2, the third
//! design of Fig. 4.8).
//!
//! One call, [`ClusterApi::reserve`], hands every bundle to the head, whose scheduler places
//! them all at once or none, with any [`GangStrategy`](escher_proto::types::GangStrategy).
//! Each bundle is held by a native holder task that no worker runs, and the head creates the
//! gang's resources directly in its resource table, so there is no ghost to dispatch, no
//! rollback, and releasing is instant. A gang that does not fit waits whole (nothing held);
//! with a timeout the head cancels it whole.

use std::time::Duration;

use super::hold::{self, Held};
use super::{Gang, GangRequest, GangScheduler};
use crate::{ClusterApi, EslError};

/// Gangs held by the head's native reservations.
#[derive(Debug, Clone)]
pub struct NativeGangs<C> {
    cluster: C,
    timeout: Option<Duration>,
}

impl<C: ClusterApi> NativeGangs<C> {
    /// The FrameSpace design over `cluster`; with `timeout` the head gives up on a gang that
    /// is not placed within it, and `acquire` fails with [`EslError::Timeout`].
    pub fn new(cluster: C, timeout: Option<Duration>) -> NativeGangs<C> {
        NativeGangs { cluster, timeout }
    }
}

impl<C: ClusterApi> GangScheduler for NativeGangs<C> {
    async fn acquire(&self, req: &GangRequest) -> Result<Gang, EslError> {
        let reply = self
            .cluster
            .reserve(
                req.name().clone(),
                req.bundles().to_vec(),
                req.placement(),
                self.timeout,
            )
            .await?;
        if reply.placed {
            return Ok(Gang::new(req, reply.task_ids));
        }
        // Waiting whole: the head places every bundle in one step, or cancels them all when
        // its deadline passes.
        match hold::await_running(&self.cluster, &reply.task_ids, None).await? {
            Held::All => Ok(Gang::new(req, reply.task_ids)),
            _ => {
                self.cluster.cancel(reply.task_ids).await?;
                Err(EslError::Timeout {
                    what: format!("reservation {}", req.name()),
                    after: self.timeout.unwrap_or_default(),
                })
            }
        }
    }

    async fn release(&self, gang: Gang) -> Result<(), EslError> {
        hold::rollback(&self.cluster, gang.holders()).await
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use escher_proto::types::{GangStrategy, TaskState};

    use super::*;
    use crate::ClusterApi;
    use crate::gang::testing::{
        all_complete, app, assert_clean, blocker, cluster, gang, leftovers,
    };

    #[tokio::test(start_paused = true)]
    async fn a_gang_waits_whole_and_is_placed_in_one_step() {
        let cluster = cluster(3, "cpu=4");
        let other = blocker(&cluster, "cpu=4").await;
        let native = Arc::new(NativeGangs::new(cluster.clone(), None));
        let req = gang("g", &["cpu=4", "cpu=4", "cpu=4"]);
        let waiting = tokio::spawn({
            let (native, req) = (native.clone(), req.clone());
            async move { native.acquire(&req).await }
        });
        tokio::time::sleep(Duration::from_secs(1)).await;
        assert!(!waiting.is_finished());
        // Nothing is held while it waits: two nodes stay idle, no gang resource exists.
        let (names, mut cpu) = leftovers(&cluster).await;
        cpu.sort();
        assert!(names.is_empty(), "{names:?}");
        assert_eq!(cpu, ["0", "0", "4"]);

        cluster.cancel(vec![other]).await.unwrap();
        let held = waiting.await.unwrap().unwrap();
        for h in held.holders() {
            assert_eq!(cluster.status(*h).await.unwrap().state, TaskState::Running);
        }
        native.release(held).await.unwrap();
        assert_clean(&cluster).await;
        app(native.as_ref(), &cluster, &req, Duration::ZERO)
            .await
            .unwrap();
        assert_eq!(
            cluster.dispatches().len(),
            1 + 3,
            "only the blocker and the members went to workers: holders are native"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn the_heads_timeout_cancels_the_whole_gang() {
        let cluster = cluster(2, "cpu=4");
        let other = blocker(&cluster, "cpu=4").await;
        let native = Arc::new(NativeGangs::new(
            cluster.clone(),
            Some(Duration::from_millis(100)),
        ));
        let waiting = tokio::spawn({
            let native = native.clone();
            async move { native.acquire(&gang("g", &["cpu=4", "cpu=4"])).await }
        });
        tokio::time::sleep(Duration::from_millis(10)).await;
        cluster.advance(Duration::from_millis(150)); // the head's clock
        let err = waiting.await.unwrap().unwrap_err();
        assert!(matches!(err, EslError::Timeout { .. }), "{err}");
        cluster.cancel(vec![other]).await.unwrap();
        assert_clean(&cluster).await;
    }

    #[tokio::test(start_paused = true)]
    async fn strategies_and_competing_gangs() {
        let cluster = cluster(3, "cpu=4");
        let native = Arc::new(NativeGangs::new(cluster.clone(), None));
        let spread = gang("s", &["cpu=1", "cpu=1", "cpu=1"]).strategy(GangStrategy::StrictSpread);
        let held = native.acquire(&spread).await.unwrap();
        let mut nodes: Vec<_> = held.holders().iter().map(|t| cluster.node_of(*t)).collect();
        nodes.sort();
        nodes.dedup();
        assert_eq!(nodes.len(), 3);
        native.release(held).await.unwrap();
        all_complete(&cluster, |_| native.clone()).await;
    }
}
