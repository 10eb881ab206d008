//! `sec`, the cost of security (docs/DESIGN.md §10): the W1 and W2 shapes against three heads in
//! the same run, one after the other:
//!
//! - **open**: no token checked (every caller is an admin; a setting only the harness uses);
//! - **auth**: every call's token checked by the auth layer (the default on loopback);
//! - **auth + TLS**: the same, over TLS (rustls, the head's generated certificate), as a head
//!   reachable from other machines always runs.
//!
//! Each is measured in W1's two throughput modes (batches of 1,000, and one `submit()` per
//! task) and W2's submit-then-get round trip, and reported as a ratio of the open head. The
//! three heads run side by side and are measured in turn, for several rounds, so that the
//! machine's noise falls on all of them alike; figures are medians of the rounds. The
//! target: authentication and TLS together cost at most 10% of W1 throughput, so that being
//! secure by default costs little.

use std::time::Duration;

use escher_head::runtime::TlsIdentity;
use serde_json::json;

use super::Ctx;
use super::w1_throughput::submit_per_task;
use crate::cluster::{self, noop};
use crate::report::{Figure, WorkloadReport};
use crate::stats::{Summary, median};

/// The configurations, in run order: (id, description, authenticate, TLS).
const CONFIGS: [(&str, &str, bool, bool); 3] = [
    ("open", "no authentication", false, false),
    ("auth", "tokens checked", true, false),
    ("tls", "tokens checked, over TLS", true, true),
];

/// Rounds per configuration: the three heads run side by side and are measured in turn, round
/// after round, so that a slow moment of the machine falls on all three alike; each figure is
/// the median of its rounds.
fn rounds(ctx: &Ctx) -> usize {
    ctx.size.pick(1, 3, 7)
}

/// One configuration's head, client and measurements.
struct Head {
    id: &'static str,
    what: &'static str,
    cluster: escher::LocalCluster,
    client: escher::Client,
    batched: Vec<f64>,
    per_task: Vec<f64>,
    trips: Vec<Duration>,
    _dir: tempfile::TempDir,
}

/// Runs `sec`.
pub async fn run(ctx: &Ctx) -> anyhow::Result<WorkloadReport> {
    let n = ctx.params.w9_tasks;
    let rounds = rounds(ctx);
    let trips = ctx.params.w2_round_trips.div_ceil(rounds);
    let mut report = WorkloadReport::new(
        "sec",
        "the cost of authentication and TLS: W1 throughput and W2 latency, as ratios of a head \
         that checks nothing",
        ctx.size.as_str(),
    );
    report.setup = json!({
        "nodes": "2 in-process workers, cpu=4 each, per head",
        "task": "function task `noop`, cpu=1",
        "tasks": n,
        "rounds": rounds,
        "round_trips_per_round": trips,
        "configurations": CONFIGS.iter().map(|c| c.1).collect::<Vec<_>>(),
        "figures": "the median of the rounds; the heads are measured in turn in each round",
    });
    let limit = ctx.limit(Duration::from_secs(600));
    let mut heads = Vec::with_capacity(CONFIGS.len());
    for (id, what, authenticate, tls) in CONFIGS {
        let dir = tempfile::Builder::new().prefix("escher-sec-").tempdir()?;
        let mut config = escher_head::HeadConfig {
            authenticate,
            ..escher_head::HeadConfig::default()
        };
        if tls {
            config.tls = Some(TlsIdentity::generated(dir.path(), [127, 0, 0, 1].into())?);
        }
        let cluster = cluster::builder(2, "cpu=4")?
            .head_config(config)
            .start()
            .await?;
        let client = cluster.client().await?;
        cluster::run_batch(&client, (0..200).map(|_| noop()).collect(), limit).await?;
        heads.push(Head {
            id,
            what,
            cluster,
            client,
            batched: Vec::new(),
            per_task: Vec::new(),
            trips: Vec::new(),
            _dir: dir,
        });
    }
    for _ in 0..rounds {
        for head in &mut heads {
            let batch = (0..n).map(|_| noop()).collect();
            let wall = cluster::run_batch(&head.client, batch, limit).await?;
            head.batched.push(n as f64 / wall.as_secs_f64());
            let wall = submit_per_task(&head.client, n, limit).await?;
            head.per_task.push(n as f64 / wall.as_secs_f64());
            for _ in 0..trips {
                head.trips
                    .push(cluster::round_trip(&head.client, noop(), limit).await?);
            }
        }
    }
    let mut base: Option<(f64, f64, f64)> = None;
    let mut detail = Vec::new();
    for head in heads {
        let (id, what) = (head.id, head.what);
        let batched = median(&head.batched);
        let per_task = median(&head.per_task);
        let p50 = Summary::of_ms(&head.trips).p50;
        drop(head.client);
        head.cluster.shutdown().await;
        let (base_batched, base_per_task, base_p50) = *base.get_or_insert((batched, per_task, p50));
        report.figures.push(Figure::new(
            format!("sec.{id}.batched"),
            format!("{what}: no-op tasks/s, batches of 1,000"),
            "tasks/s",
            batched,
        ));
        report.figures.push(Figure::new(
            format!("sec.{id}.per_task"),
            format!("{what}: no-op tasks/s, one submit() per task"),
            "tasks/s",
            per_task,
        ));
        report.figures.push(Figure::new(
            format!("sec.{id}.p50"),
            format!("{what}: submit-then-get round trip, p50"),
            "ms",
            p50,
        ));
        if id != "open" {
            for (metric, ratio) in [
                ("batched", batched / base_batched),
                ("per_task", per_task / base_per_task),
                ("p50", p50 / base_p50),
            ] {
                report.figures.push(Figure::new(
                    format!("sec.{id}.{metric}_ratio"),
                    format!("{what} ÷ no authentication, {metric}"),
                    "× open",
                    ratio,
                ));
            }
        }
        detail.push(json!({
            "configuration": id,
            "batched_tasks_per_s": head.batched,
            "per_task_tasks_per_s": head.per_task,
            "round_trip_p50_ms": p50,
        }));
    }
    report.detail = json!(detail);
    Ok(report)
}
