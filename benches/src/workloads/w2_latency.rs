//! W2 latency: sequential submit-then-get round trips of a no-op function task; p50 and p99.
//!
//! Same cluster as W1 (two workers, 4 CPUs each; the task holds one CPU). Each round trip is
//! a `submit` and a `get`: a message on the client's submission stream and one on its result
//! stream, whose answer the head pushes when the task has run on a worker and its result is
//! back at the head: Ray's `ray.get(f.remote())`. For scale, it also times the cheapest call
//! there is (a `Wait` call on a finished task, answered at once). Then `Client::run` of the
//! same task (on a client that has submitted and waited before, so on the same streams), and
//! a task given 1 MiB of arguments that it returns, submitted and read with `get_bytes` (the
//! arguments go client, head, worker; the result, an object above the inline threshold, is
//! read from the worker that holds it).

use std::time::Duration;

use escher::Task;
use serde_json::json;

use super::Ctx;
use crate::cluster::{self, noop};
use crate::report::{Figure, WorkloadReport};
use crate::stats::Summary;

/// Round trips run first and not counted.
const WARMUP: usize = 50;
/// The arguments (and result) of the large round trips.
const PAYLOAD_BYTES: usize = 1024 * 1024;

/// Runs W2.
pub async fn run(ctx: &Ctx) -> anyhow::Result<WorkloadReport> {
    let n = ctx.params.w2_round_trips;
    let mut report = WorkloadReport::new(
        "w2",
        "latency: sequential submit-then-get round trips",
        ctx.size.as_str(),
    );
    report.setup = json!({
        "nodes": "2 in-process workers, cpu=4 each",
        "task": "function task `noop`, cpu=1",
        "round_trips": n,
        "warmup": WARMUP,
    });
    let cluster = cluster::start(2, "cpu=4").await?;
    let client = cluster.client().await?;
    let limit = Duration::from_secs(30);
    for _ in 0..WARMUP {
        cluster::round_trip(&client, noop(), limit).await?;
    }
    let mut samples = Vec::with_capacity(n);
    for _ in 0..n {
        samples.push(cluster::round_trip(&client, noop(), limit).await?);
    }
    let s = Summary::of_ms(&samples);
    // The same through the submit-and-wait call.
    let mut one_call = Vec::with_capacity(n);
    for _ in 0..n {
        let start = std::time::Instant::now();
        let status = client.run(noop(), Some(limit)).await?;
        anyhow::ensure!(status.state.is_terminal(), "run returned {status:?}");
        one_call.push(start.elapsed());
    }
    let r = Summary::of_ms(&one_call);
    // The same with 1 MiB of arguments that the task returns: the arguments reach the worker
    // through the head; the result, above the inline threshold, stays on the worker as an
    // object and is read from it.
    let payload = vec![0x5a_u8; PAYLOAD_BYTES];
    let mut large = Vec::with_capacity(n / 10);
    for _ in 0..(n / 10).max(10) {
        let task = Task::function(cluster::ECHO, payload.clone()).resource("cpu", 1);
        let start = std::time::Instant::now();
        let handle = client.submit(task).await?;
        let bytes = client.get_bytes(handle.id(), Some(limit)).await?;
        large.push(start.elapsed());
        anyhow::ensure!(
            bytes.len() == PAYLOAD_BYTES,
            "echo returned {} bytes",
            bytes.len()
        );
    }
    let l = Summary::of_ms(&large);
    // The floor: one gRPC call the head answers at once (a wait on a finished task).
    let done = client.submit(noop()).await?;
    client.get_result(done.id(), Some(limit)).await?;
    let mut floor = Vec::with_capacity(n);
    for _ in 0..n {
        let start = std::time::Instant::now();
        client.wait([done.id()], 1, Some(limit)).await?;
        floor.push(start.elapsed());
    }
    let f = Summary::of_ms(&floor);
    report.figures.push(
        Figure::new("w2.p50", "submit-then-get round trip, p50", "ms", s.p50).vs("ray", "w2.p50"),
    );
    report.figures.push(
        Figure::new("w2.p99", "submit-then-get round trip, p99", "ms", s.p99).vs("ray", "w2.p99"),
    );
    report.figures.push(
        Figure::new(
            "w2.run.p50",
            "submit-and-wait (Client::run), p50",
            "ms",
            r.p50,
        )
        .vs("ray", "w2.p50"),
    );
    report.figures.push(Figure::new(
        "w2.run.p99",
        "submit-and-wait (Client::run), p99",
        "ms",
        r.p99,
    ));
    report.figures.push(Figure::new(
        "w2.run_over_floor",
        "submit-and-wait ÷ one bare gRPC call, p50 (target ≤ 2)",
        "×",
        r.p50 / f.p50,
    ));
    report.figures.push(Figure::new(
        "w2.run_1mib.p50",
        "submit then get_bytes of a task given 1 MiB of arguments that returns them, p50",
        "ms",
        l.p50,
    ));
    report.figures.push(Figure::new(
        "w2.rpc_floor.p50",
        "for scale: one gRPC call answered at once (Wait on a finished task), p50",
        "ms",
        f.p50,
    ));
    report.detail = json!({
        "round_trip_ms": s,
        "run_ms": r,
        "run_1mib_ms": l,
        "rpc_floor_ms": f,
    });
    drop(client);
    cluster.shutdown().await;
    Ok(report)
}
