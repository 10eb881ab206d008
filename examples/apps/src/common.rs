//! What the applications share: compressed time, the clusters they run on, and counting the
//! lines a policy costs.

use std::time::Duration;

use escher::types::{ResourceSet, TaskId};
use escher::{Client, Functions, LocalCluster, Task};
use statrs::statistics::{Data, Median, OrderStatistics};

/// The error type of the applications.
pub type AnyResult<T> = Result<T, Box<dyn std::error::Error + Send + Sync>>;

/// Compressed time: the experiments state their costs in simulated seconds (the thesis'
/// clusters run minutes); one simulated second lasts `ms_per_s` milliseconds of wall time.
#[derive(Debug, Clone, Copy, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct Clock {
    /// Wall-clock milliseconds per simulated second.
    pub ms_per_s: f64,
}

impl Clock {
    /// The wall time of `secs` simulated seconds.
    pub fn wall(self, secs: f64) -> Duration {
        Duration::from_secs_f64((secs * self.ms_per_s / 1000.0).max(0.0))
    }

    /// Sleeps for `secs` simulated seconds.
    pub async fn sleep(self, secs: f64) {
        tokio::time::sleep(self.wall(secs)).await;
    }

    /// A wall-clock duration in simulated seconds.
    pub fn simulated(self, wall: Duration) -> f64 {
        wall.as_secs_f64() * 1000.0 / self.ms_per_s
    }
}

/// The resource that names a node the way a node label does (Kubernetes' `hostname` label,
/// Ray's `node:<ip>`): the *hard-coded* placements pin a task to a node with it. It is
/// declared when the worker starts (static), never created by a policy.
pub fn host(k: usize) -> String {
    format!("host-{k}")
}

/// An embedded cluster of `nodes` workers, worker `k` with `resources` plus `host-k`.
pub async fn cluster(
    nodes: usize,
    resources: &str,
    functions: Functions,
) -> AnyResult<LocalCluster> {
    let mut builder = LocalCluster::builder().no_workers().functions(functions);
    for k in 0..nodes {
        let set: ResourceSet = format!("{resources},{}=1000", host(k)).parse()?;
        builder = builder.worker(set);
    }
    Ok(builder.start().await?)
}

/// Submits `tasks` in one call; their ids, in order.
pub async fn submit_all(client: &Client, tasks: Vec<Task>) -> AnyResult<Vec<TaskId>> {
    Ok(client
        .submit_batch(tasks)
        .await?
        .iter()
        .map(|r| r.id())
        .collect())
}

/// The lines of `source` marked as a policy's (a trailing `// policy` comment).
pub fn policy_lines(source: &str) -> usize {
    source
        .lines()
        .filter(|l| l.trim_end().ends_with("// policy"))
        .count()
}

/// The `q`-quantile (0..=1) of `values` ([`statrs`]' estimator); 0 when empty.
pub fn quantile(values: &[f64], q: f64) -> f64 {
    if values.is_empty() {
        return 0.0;
    }
    Data::new(values.to_vec()).quantile(q)
}

/// The median of `values` (of an even count, the mean of the middle two); 0 when empty.
pub fn median(values: &[f64]) -> f64 {
    if values.is_empty() {
        return 0.0;
    }
    Data::new(values.to_vec()).median()
}

/// Prints a check and fails when it does not hold.
pub fn check(ok: bool, what: &str) -> AnyResult<()> {
    println!("   check: {what}: {}", if ok { "yes" } else { "NO" });
    if ok {
        Ok(())
    } else {
        Err(format!("check failed: {what}").into())
    }
}
