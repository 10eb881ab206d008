//! Measures two of the targets of docs/DESIGN.md §8 on an embedded cluster: no-op function tasks
//! per second submitted asynchronously from one client, and the synchronous submit-to-result round
//! trip. The full benchmark harness (with Ray side by side) lives in `benches/`.
//!
//! Run: `cargo run --release --example throughput [-- TASKS ROUND_TRIPS]`.

use std::time::Instant;

use escher::{Functions, LocalCluster, Task};

type AnyResult<T> = Result<T, Box<dyn std::error::Error + Send + Sync>>;

#[tokio::main]
async fn main() -> AnyResult<()> {
    let mut args = std::env::args().skip(1);
    let tasks: usize = args
        .next()
        .map(|a| a.parse())
        .transpose()?
        .unwrap_or(10_000);
    let trips: usize = args.next().map(|a| a.parse()).transpose()?.unwrap_or(1_000);
    let functions = Functions::new().function("noop", |_ctx, _args| async move { Ok(Vec::new()) });
    let cluster = LocalCluster::builder()
        .workers(2)
        .functions(functions)
        .start()
        .await?;
    let client = cluster.client().await?;
    let noop = || Task::function("noop", Vec::new()).resources_str("cpu=0.001");

    // Throughput: submit everything in batches without waiting, then wait for all.
    let start = Instant::now();
    let mut refs = Vec::with_capacity(tasks);
    for chunk in (0..tasks).collect::<Vec<_>>().chunks(1_000) {
        refs.extend(client.submit_batch(chunk.iter().map(|_| noop())).await?);
    }
    let submitted = start.elapsed();
    let (ready, not_ready) = client
        .wait(refs.iter().map(|r| r.id()), tasks, None)
        .await?;
    let elapsed = start.elapsed();
    assert!(not_ready.is_empty() && ready.len() == tasks);
    println!(
        "throughput: {tasks} no-op tasks in {:.3} s = {:.0} tasks/s (submitted in {:.3} s)",
        elapsed.as_secs_f64(),
        tasks as f64 / elapsed.as_secs_f64(),
        submitted.as_secs_f64()
    );

    // Round trip: submit one, wait for its result, repeat.
    let mut samples = Vec::with_capacity(trips);
    for _ in 0..trips {
        let t = Instant::now();
        let r = client.submit(noop()).await?;
        client.get_result(r.id(), None).await?;
        samples.push(t.elapsed().as_secs_f64() * 1e6);
    }
    samples.sort_by(f64::total_cmp);
    let pct = |p: f64| samples[((samples.len() - 1) as f64 * p) as usize];
    println!(
        "round trip: {trips} sequential submit+get: p50 {:.0} us, p90 {:.0} us, p99 {:.0} us, \
         max {:.0} us",
        pct(0.5),
        pct(0.9),
        pct(0.99),
        pct(1.0)
    );
    cluster.shutdown().await;
    Ok(())
}
