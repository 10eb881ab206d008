//! `sec`, the cost of security (issue 10): the W1 and W2 shapes against three heads in the same
//! run, one after the other:
//!
//! - **open**: no token checked (every caller is an admin; a setting only the harness uses);
//! - **auth**: every call's token checked by the auth layer (the default on loopback);
//! - **auth + TLS**: the same, over TLS (rustls, the head's generated certificate), as a head
//!   reachable from other machines always runs.
//!
//! Each is measured in W1's two throughput modes (batches of 1,000, and one `submit()` per
//! task) and W2's submit-then-get round trip, and reported as a ratio of the open head. The
//! issue's target: authentication and TLS together cost at most 10% of W1 throughput.

use std::time::Duration;

use escher_head::runtime::TlsIdentity;
use serde_json::json;

use super::Ctx;
use super::w1_throughput::submit_per_task;
use crate::cluster::{self, noop};
use crate::report::{Figure, WorkloadReport};
use crate::stats::Summary;

/// The configurations, in run order: (id, description, authenticate, TLS).
const CONFIGS: [(&str, &str, bool, bool); 3] = [
    ("open", "no authentication", false, false),
    ("auth", "tokens checked", true, false),
    ("tls", "tokens checked, over TLS", true, true),
];

/// Runs `sec`.
pub async fn run(ctx: &Ctx) -> anyhow::Result<WorkloadReport> {
    let n = ctx.params.w9_tasks;
    let trips = ctx.params.w2_round_trips;
    let mut report = WorkloadReport::new(
        "sec",
        "the cost of authentication and TLS: W1 throughput and W2 latency, as ratios of a head \
         that checks nothing",
        ctx.size.as_str(),
    );
    report.setup = json!({
        "nodes": "2 in-process workers, cpu=4 each",
        "task": "function task `noop`, cpu=1",
        "tasks": n,
        "round_trips": trips,
        "configurations": CONFIGS.iter().map(|c| c.1).collect::<Vec<_>>(),
    });
    let limit = ctx.limit(Duration::from_secs(600));
    let mut base: Option<(f64, f64, f64)> = None;
    let mut detail = Vec::new();
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
        let wall = cluster::run_batch(&client, (0..n).map(|_| noop()).collect(), limit).await?;
        let batched = n as f64 / wall.as_secs_f64();
        let wall = submit_per_task(&client, n, limit).await?;
        let per_task = n as f64 / wall.as_secs_f64();
        let mut samples = Vec::with_capacity(trips);
        for _ in 0..trips {
            samples.push(cluster::round_trip(&client, noop(), limit).await?);
        }
        let p50 = Summary::of_ms(&samples).p50;
        drop(client);
        cluster.shutdown().await;
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
            "batched_tasks_per_s": batched,
            "per_task_tasks_per_s": per_task,
            "round_trip_p50_ms": p50,
        }));
    }
    report.detail = json!(detail);
    Ok(report)
}
