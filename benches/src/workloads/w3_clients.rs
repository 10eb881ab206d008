//! W3 many clients: 4 clients, each on its own connection, submit no-op tasks at once (batches
//! of 1,000, then one wait each); tasks/s over all of them, from the common start to the last
//! result. The shape of Ray's `multi_client_tasks_async` (4 submitters of 10,000 tasks each).

use std::time::{Duration, Instant};

use serde_json::json;
use tokio::sync::Barrier;
use tokio::task::JoinSet;

use super::Ctx;
use crate::cluster::{self, noop};
use crate::report::{Figure, WorkloadReport};
use std::sync::Arc;

/// Runs W3.
pub async fn run(ctx: &Ctx) -> anyhow::Result<WorkloadReport> {
    let clients = ctx.params.w3_clients;
    let each = ctx.params.w3_tasks_per_client;
    let mut report = WorkloadReport::new(
        "w3",
        "many clients: concurrent submitters",
        ctx.size.as_str(),
    );
    report.setup = json!({
        "nodes": "2 in-process workers, cpu=4 each",
        "task": "function task `noop`, cpu=1",
        "clients": clients,
        "tasks_per_client": each,
        "client": "escher::Client, each with its own HTTP/2 connection, in its own tokio task",
    });
    let cluster = cluster::start(2, "cpu=4").await?;
    let limit = Duration::from_secs(600);
    let warm = cluster.client().await?;
    cluster::run_batch(&warm, (0..200).map(|_| noop()).collect(), limit).await?;

    let barrier = Arc::new(Barrier::new(clients + 1));
    let mut set = JoinSet::new();
    for _ in 0..clients {
        let client = cluster.client().await?;
        let barrier = Arc::clone(&barrier);
        set.spawn(async move {
            barrier.wait().await;
            cluster::run_batch(&client, (0..each).map(|_| noop()).collect(), limit).await
        });
    }
    barrier.wait().await;
    let start = Instant::now();
    let mut per_client = Vec::new();
    while let Some(done) = set.join_next().await {
        per_client.push(done??.as_secs_f64());
    }
    let wall = start.elapsed();
    let total = clients * each;
    let rate = total as f64 / wall.as_secs_f64();
    report.figures.push(
        Figure::new(
            "w3.tasks_per_s",
            format!(
                "{clients} clients × {} no-op tasks, at once",
                crate::report::num(each as f64)
            ),
            "tasks/s",
            rate,
        )
        .vs("ray", "w3"),
    );
    report.detail = json!({ "wall_s": wall.as_secs_f64(), "per_client_s": per_client });
    drop(warm);
    cluster.shutdown().await;
    Ok(report)
}
