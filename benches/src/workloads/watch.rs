//! `watch`, the cost of watching (docs/DESIGN.md §11): W1's two throughput shapes with no watcher
//! and with 10 watchers subscribed to every event, on one cluster, in one run.
//!
//! Each watcher is its own client (its own HTTP/2 connection) reading its stream in its own
//! task and counting what it gets, as ten dashboards or ESLs would. Each round runs both, the
//! first alternating from round to round, so that a drift of the machine falls on both alike;
//! figures are medians of the rounds, ratios the median of the rounds' ratios. On this machine the watchers' own decoding shares the
//! two cores with the head and the client, so the ratio includes it. The target:
//! watching costs at most 10% of W1 throughput, so that ESLs and dashboards can watch instead
//! of polling.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use escher::types::WatchRequest;
use serde_json::json;

use super::Ctx;
use super::w1_throughput::submit_per_task;
use crate::cluster::{self, noop};
use crate::report::{Figure, WorkloadReport};
use crate::stats::Summary;

/// The watchers of the "with" rounds.
const WATCHERS: usize = 10;

/// Runs `watch`.
pub async fn run(ctx: &Ctx) -> anyhow::Result<WorkloadReport> {
    let n = ctx.params.w9_tasks;
    let rounds = ctx.size.pick(1, 3, 7);
    let mut report = WorkloadReport::new(
        "watch",
        "the cost of watching: W1 throughput with 0 and with 10 watchers of every event",
        ctx.size.as_str(),
    );
    report.setup = json!({
        "nodes": "2 in-process workers, cpu=4 each",
        "task": "function task `noop`, cpu=1",
        "tasks": n,
        "rounds": rounds,
        "watchers": format!("{WATCHERS} clients, each with its own connection, watching every event (WatchRequest::all) and counting"),
        "figures": "the median of the rounds; in each round both run, the first alternating; ratios are the median of the rounds' ratios",
    });
    let limit = ctx.limit(Duration::from_secs(600));
    let cluster = cluster::start(2, "cpu=4").await?;
    let client = cluster.client().await?;
    cluster::run_batch(&client, (0..200).map(|_| noop()).collect(), limit).await?;

    let (mut batched, mut per_task) = ([Vec::new(), Vec::new()], [Vec::new(), Vec::new()]);
    let mut delivered = Vec::new();
    for round in 0..rounds {
        // Alternate which goes first, so that a drift of the machine (or of the head's state,
        // which grows up to its retention limit) falls on both alike.
        let order = if round % 2 == 0 {
            [false, true]
        } else {
            [true, false]
        };
        for with in order {
            let mut watchers = Vec::new();
            let seen = Arc::new(AtomicU64::new(0));
            if with {
                for _ in 0..WATCHERS {
                    let watcher = cluster.client().await?;
                    let mut watch = watcher.watch(WatchRequest::all()).await?;
                    let seen = Arc::clone(&seen);
                    watchers.push(tokio::spawn(async move {
                        while let Some(Ok(_)) = watch.next().await {
                            seen.fetch_add(1, Ordering::Relaxed);
                        }
                    }));
                }
            }
            let i = usize::from(with);
            let batch = (0..n).map(|_| noop()).collect();
            let wall = cluster::run_batch(&client, batch, limit).await?;
            batched[i].push(n as f64 / wall.as_secs_f64());
            let wall = submit_per_task(&client, n, limit).await?;
            per_task[i].push(n as f64 / wall.as_secs_f64());
            for w in watchers {
                w.abort();
            }
            if with {
                delivered.push(seen.load(Ordering::Relaxed));
            }
        }
    }
    let median = |v: &[f64]| Summary::of(v).p50;
    for (i, what) in [(0, "no watcher"), (1, "10 watchers of every event")] {
        let id = if i == 0 { "none" } else { "ten" };
        report.figures.push(Figure::new(
            format!("watch.{id}.batched"),
            format!("{what}: no-op tasks/s, batches of 1,000"),
            "tasks/s",
            median(&batched[i]),
        ));
        report.figures.push(Figure::new(
            format!("watch.{id}.per_task"),
            format!("{what}: no-op tasks/s, one submit() per task"),
            "tasks/s",
            median(&per_task[i]),
        ));
    }
    // Each round's two runs are a pair: the ratio is the median of the rounds' ratios.
    for (metric, values) in [("batched", &batched), ("per_task", &per_task)] {
        let ratios: Vec<f64> = values[1]
            .iter()
            .zip(&values[0])
            .map(|(ten, none)| ten / none)
            .collect();
        report.figures.push(Figure::new(
            format!("watch.ten.{metric}_ratio"),
            format!("10 watchers ÷ none, {metric} (median of the rounds' ratios)"),
            "× none",
            median(&ratios),
        ));
    }
    report.detail = json!({
        "batched_tasks_per_s": {"none": batched[0], "ten": batched[1]},
        "per_task_tasks_per_s": {"none": per_task[0], "ten": per_task[1]},
        "events_delivered_per_with_round": delivered,
    });
    drop(client);
    cluster.shutdown().await;
    Ok(report)
}
