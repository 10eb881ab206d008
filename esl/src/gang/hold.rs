//! What the two ghost-based designs share: one ghost task per bundle that holds the bundle and
//! creates the gang's resources on its node, waiting until every ghost runs, and rolling back.
//!
//! The ghosts' starts and ends come from the cluster's events (the watch API), so waiting for
//! a gang costs one subscription, not a status read per ghost every few milliseconds.

use std::time::Duration;

use escher_proto::types::{
    Amount, Capacity, GangStrategy, NodeSpec, ResourceName, ResourceSet, TaskId, TaskKind,
    TaskSpec, TaskStatus,
};

use super::{Gang, GangRequest};
use crate::api::{Started, await_started};
use crate::{ClusterApi, EslError};

/// How long a rollback or a release may take to see every ghost end.
const DRAIN_LIMIT: Duration = Duration::from_secs(30);

/// How waiting for a gang's ghosts ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Held {
    /// Every ghost runs: the gang is held.
    All,
    /// A ghost ended (its pending deadline passed, its node died, someone cancelled it).
    Ended(TaskStatus),
    /// The time allowed passed with some ghosts still pending.
    TimedOut,
}

/// The ghosts that hold `req`: one per bundle, or a single one for a strict pack. Each creates
/// `NAME.RES` and `NAME-I.RES` for its bundles while it lives; `deadline` lets the head cancel
/// a ghost still pending after that long.
pub(crate) fn ghosts(
    req: &GangRequest,
    deadline: Option<Duration>,
) -> Result<Vec<TaskSpec>, EslError> {
    let groups: Vec<Vec<usize>> = match req.strategy {
        GangStrategy::StrictPack => vec![(0..req.bundles.len()).collect()],
        _ => (0..req.bundles.len()).map(|i| vec![i]).collect(),
    };
    let mut specs = Vec::with_capacity(groups.len());
    for group in groups {
        let mut holds = ResourceSet::new();
        let mut shared = ResourceSet::new();
        let mut creates: Vec<(ResourceName, Capacity)> = Vec::new();
        for &i in &group {
            let bundle = &req.bundles[i];
            holds.merge(bundle)?;
            for (res, amount) in bundle.iter() {
                shared.merge(&single(req.gang_resource(None, res)?, amount))?;
                creates.push((req.gang_resource(Some(i), res)?, Capacity::Finite(amount)));
            }
        }
        creates.extend(shared.iter().map(|(r, a)| (r.clone(), Capacity::Finite(a))));
        if req.strategy == GangStrategy::StrictSpread {
            holds.merge(&single(req.spread_resource()?, Amount::ONE))?;
        }
        specs.push(TaskSpec {
            name: format!("{} ghost {}", req.name, group[0]),
            kind: TaskKind::Ghost { creates, ttl: None },
            resources: holds,
            labels: Default::default(),
            max_retries: 0,
            timeout: None,
            pending_deadline: deadline,
            on_start: Vec::new(),
            on_success: Vec::new(),
        });
    }
    Ok(specs)
}

fn single(name: ResourceName, amount: Amount) -> ResourceSet {
    let mut set = ResourceSet::new();
    set.insert(name, amount);
    set
}

/// Before the first ghost of a strict spread: `NAME-spread` with capacity 1 on every live
/// node, which each ghost holds, so no two ghosts of the gang share a node.
pub(crate) async fn prepare<C: ClusterApi>(cluster: &C, req: &GangRequest) -> Result<(), EslError> {
    if req.strategy == GangStrategy::StrictSpread {
        let every = NodeSpec::Match {
            resources: ResourceSet::new(),
            num_nodes: None,
        };
        let one = Capacity::Finite(Amount::ONE);
        cluster
            .set_resource(req.spread_resource()?, one, every)
            .await?;
    }
    Ok(())
}

/// Undoes [`prepare`] (the resource goes once the last ghost holding it ends).
pub(crate) async fn unprepare<C: ClusterApi>(
    cluster: &C,
    req: &GangRequest,
) -> Result<(), EslError> {
    if req.strategy == GangStrategy::StrictSpread {
        let every = NodeSpec::Match {
            resources: ResourceSet::new(),
            num_nodes: None,
        };
        cluster
            .delete_resource(req.spread_resource()?, every)
            .await?;
    }
    Ok(())
}

/// Waits until every ghost runs, one ends, or `limit` passes (`None`: no limit), from the
/// cluster's events.
pub(crate) async fn await_running<C: ClusterApi>(
    cluster: &C,
    ghosts: &[TaskId],
    limit: Option<Duration>,
) -> Result<Held, EslError> {
    let deadline = limit.map(|l| tokio::time::Instant::now() + l);
    Ok(match await_started(cluster, ghosts, deadline).await? {
        Started::All => Held::All,
        Started::Ended(status) => Held::Ended(status),
        Started::TimedOut(_) => Held::TimedOut,
    })
}

/// Cancels every ghost and waits until all have ended, so that nothing they held or created
/// is left behind when this returns.
pub(crate) async fn rollback<C: ClusterApi>(
    cluster: &C,
    ghosts: &[TaskId],
) -> Result<(), EslError> {
    if ghosts.is_empty() {
        return Ok(());
    }
    cluster.cancel(ghosts.to_vec()).await?;
    let after = cluster
        .wait(ghosts.to_vec(), ghosts.len(), DRAIN_LIMIT)
        .await?;
    if after.iter().all(|s| s.state.is_terminal()) {
        Ok(())
    } else {
        Err(EslError::Timeout {
            what: format!("the end of cancelled ghosts {ghosts:?}"),
            after: DRAIN_LIMIT,
        })
    }
}

/// Releases a gang held by ghosts: cancels them, waits for their end, and undoes [`prepare`].
pub(crate) async fn release<C: ClusterApi>(cluster: &C, gang: &Gang) -> Result<(), EslError> {
    rollback(cluster, gang.holders()).await?;
    unprepare(cluster, gang.request()).await
}
