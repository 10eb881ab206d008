//! AppSpace gang scheduling: ghost tasks with timeouts (thesis §4.4.2, the first design of
//! Fig. 4.8).
//!
//! To hold a gang, the application submits one ghost per bundle. Each ghost holds its
//! bundle's physical resources and, while it lives, creates the gang's resources on its node.
//! If every ghost runs within [`GhostConfig::timeout`], the gang is held. Otherwise the
//! attempt is rolled back: every ghost is cancelled and this waits until all have ended, so no
//! partial hold outlives the attempt. Then it waits a back-off and tries again.
//!
//! Two applications whose gangs each hold part of what both need would wait for each other
//! forever; the timeout breaks that deadlock. If both retried after the same pause they could
//! collide again and again (live-lock), so the pause is an exponential back-off with jitter,
//! drawn from a seeded generator ([`GhostConfig::seed`]; give each application its own) so
//! that tests are reproducible. The ghosts also carry the timeout as their pending deadline,
//! so the head cancels a pending ghost by itself if the application goes away.

use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use backon::{BackoffBuilder, ExponentialBackoff, ExponentialBuilder};

use super::hold::{self, Held};
use super::{Gang, GangRequest, GangScheduler};
use crate::{ClusterApi, EslError};

/// How the AppSpace design waits, backs off and gives up.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct GhostConfig {
    /// How long all ghosts of one attempt may take to run before it is rolled back.
    pub timeout: Duration,
    /// The back-off after the first failed attempt; it doubles after each one.
    pub base_backoff: Duration,
    /// The longest back-off.
    pub max_backoff: Duration,
    /// How many attempts before giving up with [`EslError::Timeout`].
    pub max_attempts: u32,
    /// Seeds the back-off jitter.
    pub seed: u64,
}

impl Default for GhostConfig {
    fn default() -> GhostConfig {
        GhostConfig {
            timeout: Duration::from_secs(1),
            base_backoff: Duration::from_millis(20),
            max_backoff: Duration::from_secs(1),
            max_attempts: 64,
            seed: 0,
        }
    }
}

/// Gangs held by the application's own ghost tasks, with timeouts and back-off.
#[derive(Debug)]
pub struct GhostGangs<C> {
    cluster: C,
    config: GhostConfig,
    /// Seeds each acquire's back-off jitter.
    seeds: Mutex<fastrand::Rng>,
    rollbacks: AtomicU64,
}

impl<C: ClusterApi> GhostGangs<C> {
    /// The AppSpace design over `cluster`.
    pub fn new(cluster: C, config: GhostConfig) -> GhostGangs<C> {
        GhostGangs {
            cluster,
            seeds: Mutex::new(fastrand::Rng::with_seed(config.seed)),
            config,
            rollbacks: AtomicU64::new(0),
        }
    }

    /// How many attempts were rolled back so far.
    pub fn rollbacks(&self) -> u64 {
        self.rollbacks.load(Ordering::Relaxed)
    }

    /// One attempt: the gang, or `None` after a rollback.
    async fn attempt(&self, req: &GangRequest) -> Result<Option<Gang>, EslError> {
        let specs = hold::ghosts(req, Some(self.config.timeout))?;
        let ghosts = self.cluster.submit(specs).await?;
        let held = hold::await_running(&self.cluster, &ghosts, Some(self.config.timeout)).await;
        if let Ok(Held::All) = held {
            return Ok(Some(Gang::new(req, ghosts)));
        }
        hold::rollback(&self.cluster, &ghosts).await?;
        self.rollbacks.fetch_add(1, Ordering::Relaxed);
        held.map(|_| None)
    }

    /// The pauses of one acquire, after each failed attempt: "equal jitter", the `n`th (from
    /// 0) uniform in `[cap / 2, cap)` with `cap = min(max_backoff, base_backoff * 2^n)`
    /// (backon's jitter adds up to the delay again to half of the cap).
    fn backoff(&self) -> ExponentialBackoff {
        let seed = self.seeds.lock().unwrap_or_else(|p| p.into_inner()).u64(..);
        ExponentialBuilder::default()
            .with_min_delay(self.config.base_backoff / 2)
            .with_max_delay(self.config.max_backoff / 2)
            .without_max_times()
            .with_jitter()
            .with_jitter_seed(seed)
            .build()
    }
}

impl<C: ClusterApi> GangScheduler for GhostGangs<C> {
    async fn acquire(&self, req: &GangRequest) -> Result<Gang, EslError> {
        hold::prepare(&self.cluster, req).await?;
        let mut pauses = self.backoff();
        for _ in 0..self.config.max_attempts {
            match self.attempt(req).await {
                Ok(Some(gang)) => return Ok(gang),
                Ok(None) => {
                    let pause = pauses.next().unwrap_or(self.config.max_backoff);
                    tokio::time::sleep(pause).await;
                }
                Err(e) => {
                    let _ = hold::unprepare(&self.cluster, req).await;
                    return Err(e);
                }
            }
        }
        hold::unprepare(&self.cluster, req).await?;
        Err(EslError::Timeout {
            what: format!(
                "gang {} (all {} bundles held) in {} attempts",
                req.name(),
                req.bundles().len(),
                self.config.max_attempts
            ),
            after: self.config.timeout * self.config.max_attempts,
        })
    }

    async fn release(&self, gang: Gang) -> Result<(), EslError> {
        hold::release(&self.cluster, &gang).await
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

    fn config(timeout_ms: u64, seed: u64) -> GhostConfig {
        GhostConfig {
            timeout: Duration::from_millis(timeout_ms),
            seed,
            ..GhostConfig::default()
        }
    }

    #[tokio::test(start_paused = true)]
    async fn a_partial_hold_times_out_rolls_back_and_leaks_nothing() {
        let cluster = cluster(3, "cpu=4");
        let other = blocker(&cluster, "cpu=4").await;
        let ghosts = GhostGangs::new(
            cluster.clone(),
            GhostConfig {
                max_attempts: 2,
                ..config(100, 1)
            },
        );
        let req = gang("g", &["cpu=4", "cpu=4", "cpu=4"]);
        let err = ghosts.acquire(&req).await.unwrap_err();
        assert!(matches!(err, EslError::Timeout { .. }), "{err}");
        assert_eq!(ghosts.rollbacks(), 2);
        // Each attempt held two bundles (the blocker's node had no room for the third)...
        assert_eq!(cluster.dispatches().len(), 1 + 2 + 2);
        // ...and after the rollbacks only the blocker holds anything.
        let (names, mut cpu) = leftovers(&cluster).await;
        assert!(names.is_empty(), "{names:?}");
        cpu.sort();
        assert_eq!(cpu, ["0", "0", "4"]);
        let status = cluster.cluster_status().await.unwrap();
        assert_eq!((status.pending_tasks, status.running_tasks), (0, 1));

        // Once the room is there, the same gang is held whole and its members run inside it.
        cluster.cancel(vec![other]).await.unwrap();
        app(&ghosts, &cluster, &req, Duration::ZERO).await.unwrap();
        assert_clean(&cluster).await;
    }

    #[tokio::test(start_paused = true)]
    async fn competing_gangs_back_off_and_all_complete() {
        let cluster = cluster(3, "cpu=4");
        let made = std::sync::Mutex::new(Vec::new());
        let make = |i: usize| {
            let ghosts = Arc::new(GhostGangs::new(cluster.clone(), config(50, i as u64)));
            made.lock().unwrap().push(ghosts.clone());
            ghosts
        };
        all_complete(&cluster, make).await;
        let rollbacks: u64 = made.lock().unwrap().iter().map(|g| g.rollbacks()).sum();
        assert!(
            rollbacks > 0,
            "the gangs did compete: partial holds were rolled back"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn strict_strategies_are_honoured_by_ghosts() {
        let cluster = cluster(3, "cpu=4");
        let ghosts = GhostGangs::new(cluster.clone(), config(100, 7));
        let spread = gang("s", &["cpu=1", "cpu=1", "cpu=1"]).strategy(GangStrategy::StrictSpread);
        let held = ghosts.acquire(&spread).await.unwrap();
        let mut nodes: Vec<_> = held.holders().iter().map(|t| cluster.node_of(*t)).collect();
        nodes.sort();
        nodes.dedup();
        assert_eq!(nodes.len(), 3, "one bundle per node");
        ghosts.release(held).await.unwrap();
        assert_clean(&cluster).await;

        let pack = gang("p", &["cpu=2", "cpu=2"]).strategy(GangStrategy::StrictPack);
        let held = ghosts.acquire(&pack).await.unwrap();
        assert_eq!(held.holders().len(), 1, "one ghost holds the whole pack");
        let status = cluster.status(held.holders()[0]).await.unwrap();
        assert_eq!(status.state, TaskState::Running);
        let (names, _) = leftovers(&cluster).await;
        assert_eq!(
            names.len(),
            3,
            "p.cpu, p-0.cpu, p-1.cpu on one node: {names:?}"
        );
        ghosts.release(held).await.unwrap();
        assert_clean(&cluster).await;
    }

    #[test]
    fn back_off_grows_with_seeded_jitter() {
        let cluster = cluster(1, "cpu=1");
        let a = GhostGangs::new(cluster.clone(), config(10, 42));
        let b = GhostGangs::new(cluster.clone(), config(10, 42));
        let c = GhostGangs::new(cluster, config(10, 43));
        let draws: Vec<Duration> = a.backoff().take(8).collect();
        assert_eq!(draws, b.backoff().take(8).collect::<Vec<_>>());
        assert_ne!(draws, c.backoff().take(8).collect::<Vec<_>>());
        // The next acquire draws other pauses.
        assert_ne!(draws, a.backoff().take(8).collect::<Vec<_>>());
        for (n, d) in draws.iter().enumerate() {
            let cap = Duration::from_millis(20 << n).min(Duration::from_secs(1));
            assert!(
                *d >= cap / 2 && *d <= cap,
                "attempt {n}: {d:?} outside [{:?}, {cap:?}]",
                cap / 2
            );
        }
    }
}
