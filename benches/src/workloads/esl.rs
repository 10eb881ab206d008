//! `esl`, what the ESLs ask of the head (docs/DESIGN.md §11): the fair-share ESL's calls per
//! rebalance while it tracks unfinished tasks, and the soft-constraints ESL's latency from submit
//! to placement, when its first preference can be met, when it falls back to the second, and when
//! the first becomes possible while it waits (how late it notices).
//!
//! And the cost of one decision of the fair-share-over-time ESL at 1,000 nodes and 100
//! namespaces (`fair_time`), the pure policy alone.
//!
//! Every call an ESL makes goes through [`Counting`], a [`ClusterApi`] in front of the real
//! client that counts calls by kind, so the figures are calls, not guesses. The cluster is an
//! embedded one (real gRPC on loopback).

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use escher::esl::api::Events;
use escher::esl::{ClusterApi, Domain, EslError, Hfs, ResourceSpec, SoftConstraints};
use escher::types::{
    Amount, ClusterStatus, GangStrategy, NodeId, NodeSpec, ReserveReply, ResourceName, ResourceSet,
    ResourceUpdate, TaskId, TaskSpec, TaskStatus, WatchRequest,
};
use escher::{Client, Task};
use serde_json::json;

mod fair_time;

use super::Ctx;
use crate::cluster;
use crate::report::{Figure, WorkloadReport};
use crate::stats::Summary;

/// The real client, counting the calls made through it by kind.
#[derive(Debug, Clone)]
pub struct Counting {
    inner: Client,
    calls: Arc<Mutex<BTreeMap<&'static str, u64>>>,
}

impl Counting {
    fn new(inner: Client) -> Counting {
        Counting {
            inner,
            calls: Arc::default(),
        }
    }

    fn count(&self, kind: &'static str) {
        *self.calls.lock().unwrap().entry(kind).or_default() += 1;
    }

    /// The calls made so far, by kind, and forgets them.
    fn take(&self) -> BTreeMap<&'static str, u64> {
        std::mem::take(&mut *self.calls.lock().unwrap())
    }
}

impl ClusterApi for Counting {
    async fn requeue(&self, task: TaskId, r: ResourceSet) -> Result<TaskStatus, EslError> {
        self.count("requeue");
        ClusterApi::requeue(&self.inner, task, r).await
    }
    async fn gpus(&self) -> Result<Vec<escher::types::NodeGpus>, EslError> {
        self.count("gpus");
        ClusterApi::gpus(&self.inner).await
    }
    async fn change_mig(
        &self,
        node: NodeId,
        gpu: u32,
        change: escher::types::MigChange,
        drain: bool,
    ) -> Result<escher::types::MigPlan, EslError> {
        self.count("change_mig");
        ClusterApi::change_mig(&self.inner, node, gpu, change, drain).await
    }
    async fn telemetry(
        &self,
        tasks: Vec<TaskId>,
        after_ms: Option<u64>,
    ) -> Result<Vec<escher::types::TaskTelemetry>, EslError> {
        self.count("telemetry");
        ClusterApi::telemetry(&self.inner, tasks, after_ms).await
    }
    async fn set_resources(&self, u: Vec<ResourceUpdate>) -> Result<Vec<Vec<NodeId>>, EslError> {
        self.count("set_resources");
        ClusterApi::set_resources(&self.inner, u).await
    }
    async fn cluster_status(&self) -> Result<ClusterStatus, EslError> {
        self.count("cluster_status");
        ClusterApi::cluster_status(&self.inner).await
    }
    async fn submit(&self, tasks: Vec<TaskSpec>) -> Result<Vec<TaskId>, EslError> {
        self.count("submit");
        ClusterApi::submit(&self.inner, tasks).await
    }
    async fn cancel(&self, tasks: Vec<TaskId>) -> Result<Vec<TaskStatus>, EslError> {
        self.count("cancel");
        ClusterApi::cancel(&self.inner, tasks).await
    }
    async fn status(&self, task: TaskId) -> Result<TaskStatus, EslError> {
        self.count("status");
        ClusterApi::status(&self.inner, task).await
    }
    async fn wait(
        &self,
        t: Vec<TaskId>,
        n: usize,
        d: Duration,
    ) -> Result<Vec<TaskStatus>, EslError> {
        self.count("wait");
        ClusterApi::wait(&self.inner, t, n, d).await
    }
    async fn watch(&self, request: WatchRequest) -> Result<Events, EslError> {
        self.count("watch");
        ClusterApi::watch(&self.inner, request).await
    }
    async fn reserve(
        &self,
        name: ResourceName,
        bundles: Vec<ResourceSet>,
        strategy: GangStrategy,
        timeout: Option<Duration>,
    ) -> Result<ReserveReply, EslError> {
        self.count("reserve");
        ClusterApi::reserve(&self.inner, name, bundles, strategy, timeout).await
    }
}

/// Tracked tasks of the fair-share measurement.
const TRACKED: usize = 100;
/// Rebalances measured.
const REBALANCES: usize = 10;
/// The soft-constraints ESL's wait for each preference.
const SOFT_TIMEOUT: Duration = Duration::from_millis(100);
/// When the first preference of the "later" case becomes possible, after the submit.
const LATER: Duration = Duration::from_millis(30);

/// Runs `esl`.
pub async fn run(ctx: &Ctx) -> anyhow::Result<WorkloadReport> {
    let placements = ctx.size.pick(10, 30, 100);
    let mut report = WorkloadReport::new(
        "esl",
        "what ESLs ask of the head: fair-share calls per rebalance, soft-constraint placement latency",
        ctx.size.as_str(),
    );
    report.setup = json!({
        "nodes": "4 in-process workers, cpu=2 each",
        "fair_share": format!("one instance, two users; user a tracks {TRACKED} unfinished tasks (they ask for more CPU than a node has, so they stay pending); {REBALANCES} rebalances after the first"),
        "fair_time": "1,000 simulated nodes of cpu=64,gpu=8 (no cluster: the pure policy), 100 namespaces in 10 cohorts; see workloads/esl/fair_time.rs",
        "soft": format!("function task `noop`; timeout {SOFT_TIMEOUT:?} per preference; {placements} placements each way; in the `later` case the first preference's resource is created {LATER:?} after the submit (timeout 5 s)"),
    });
    // Fair share over time: one decision at 1,000 nodes and 100 namespaces (no cluster).
    let decision = fair_time::measure(ctx.size.pick(20, 50, 200))?;
    report.figures.push(Figure::new(
        "esl.fair_time.decision_p50",
        format!(
            "fair share over time: one decision at {} nodes and {} namespaces, 100 jobs ending and 100 arriving per round, p50",
            fair_time::NODES,
            fair_time::NAMESPACES
        ),
        "ms",
        decision.decision_ms.p50,
    ));
    println!(
        "esl.fair_time: one decision at {} nodes, {} namespaces: p50 {:.3} ms, p95 {:.3} ms, max {:.3} ms over {} rounds ({} admitted, {} preempted, {} running); first fill of 9,000 jobs {:.1} ms",
        fair_time::NODES,
        fair_time::NAMESPACES,
        decision.decision_ms.p50,
        decision.decision_ms.p95,
        decision.decision_ms.max,
        decision.decision_ms.count,
        decision.admitted,
        decision.preempted,
        decision.running,
        decision.fill_ms
    );
    let cluster = cluster::start(4, "cpu=2").await?;
    let client = cluster.client().await?;

    // Fair share: calls per rebalance with TRACKED unfinished tasks.
    let api = Counting::new(client.clone());
    let hfs = Hfs::new(api.clone(), "bench", Domain::All)?;
    hfs.create_user("a", 1).await?;
    hfs.create_user("b", 1).await?;
    let stuck = (0..TRACKED)
        .map(|_| {
            Task::function(cluster::NOOP, Vec::new())
                .resource("cpu", 64)
                .build()
        })
        .collect::<Result<Vec<_>, _>>()?;
    hfs.submit("a", stuck).await?;
    hfs.rebalance().await?;
    let first = api.take();
    for _ in 0..REBALANCES {
        hfs.rebalance().await?;
    }
    let steady = api.take();
    let per = |calls: &BTreeMap<&str, u64>, n: usize| calls.values().sum::<u64>() as f64 / n as f64;
    report.figures.push(Figure::new(
        "esl.fair_share.calls_per_rebalance",
        format!("fair share, {TRACKED} tracked unfinished tasks: calls per rebalance"),
        "calls",
        per(&steady, REBALANCES),
    ));
    report.figures.push(Figure::new(
        "esl.fair_share.status_per_rebalance",
        format!("fair share, {TRACKED} tracked unfinished tasks: task status reads per rebalance"),
        "calls",
        steady.get("status").copied().unwrap_or(0) as f64 / REBALANCES as f64,
    ));

    // Soft constraints: submit to placement.
    let node = cluster.nodes()[0];
    client
        .set_resource("preferred", 1_000_000, NodeSpec::Node(node))
        .await?;
    let soft = SoftConstraints::new(api.clone(), SOFT_TIMEOUT);
    let task = Task::function(cluster::NOOP, Vec::new())
        .resource("cpu", 1)
        .build()?;
    let one = |name: &str| -> anyhow::Result<ResourceSpec> {
        Ok(ResourceSpec::new().require(ResourceName::new(name)?, Amount::ONE)?)
    };
    let met = [one("preferred")?, ResourceSpec::new()];
    let unmet = [one("nowhere")?, ResourceSpec::new()];
    let mut first_met = Vec::new();
    let mut fallback = Vec::new();
    api.take();
    for _ in 0..placements {
        let start = Instant::now();
        let placed = soft.submit(&task, &met).await?;
        first_met.push(start.elapsed());
        anyhow::ensure!(placed.choice == 0 && placed.started, "{placed:?}");
        let start = Instant::now();
        let placed = soft.submit(&task, &unmet).await?;
        fallback.push(start.elapsed());
        anyhow::ensure!(placed.choice == 1 && placed.started, "{placed:?}");
    }
    let soft_calls = api.take();
    // A first preference that becomes possible while the ESL waits: how long after the
    // resource appears does the ESL know the task started?
    let patient = SoftConstraints::new(api.clone(), Duration::from_secs(5));
    let later = [one("later")?, ResourceSpec::new()];
    let mut noticed = Vec::new();
    for _ in 0..placements {
        let creator = client.clone();
        let created = tokio::spawn(async move {
            tokio::time::sleep(LATER).await;
            creator
                .set_resource("later", 1_000_000, NodeSpec::Node(node))
                .await
                .map(|_| Instant::now())
        });
        let placed = patient.submit(&task, &later).await?;
        let done = Instant::now();
        let created = created.await??;
        anyhow::ensure!(placed.choice == 0 && placed.started, "{placed:?}");
        noticed.push(done.saturating_duration_since(created));
        client
            .delete_resource("later", NodeSpec::Node(node))
            .await?;
    }
    let first_met = Summary::of_ms(&first_met);
    let fallback = Summary::of_ms(&fallback);
    let noticed = Summary::of_ms(&noticed);
    report.figures.push(Figure::new(
        "esl.soft.first_p50",
        "soft constraints, first preference met: submit to placement, p50",
        "ms",
        first_met.p50,
    ));
    report.figures.push(Figure::new(
        "esl.soft.fallback_p50",
        format!(
            "soft constraints, first preference unmet (waits {SOFT_TIMEOUT:?}): submit to placement on the second, p50"
        ),
        "ms",
        fallback.p50,
    ));
    report.figures.push(Figure::new(
        "esl.soft.later_p50",
        format!(
            "soft constraints, first preference possible {LATER:?} after submit: from the resource's creation to placement, p50"
        ),
        "ms",
        noticed.p50,
    ));
    report.figures.push(Figure::new(
        "esl.soft.later_p95",
        format!(
            "soft constraints, first preference possible {LATER:?} after submit: from the resource's creation to placement, p95"
        ),
        "ms",
        noticed.p95,
    ));
    report.figures.push(Figure::new(
        "esl.soft.calls_per_placement",
        "soft constraints: calls per placement (both cases together)",
        "calls",
        per(&soft_calls, 2 * placements),
    ));
    report.detail = json!({
        "fair_share_first_rebalance_calls": first,
        "fair_share_steady_calls": steady,
        "soft_first_met_ms": first_met,
        "soft_fallback_ms": fallback,
        "soft_later_ms": noticed,
        "soft_calls": soft_calls,
        "fair_time_decision": decision,
    });
    drop(client);
    cluster.shutdown().await;
    Ok(report)
}
