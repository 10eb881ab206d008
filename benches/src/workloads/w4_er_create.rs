//! W4 ephemeral-resource creation (thesis Fig. 4.9a): on 50 nodes, create k resources spread
//! evenly (resource i on node i mod 50), and measure the time until a no-op task requesting
//! each new resource has run. The thesis: 1 ms per request at 1,000 resources, amortised to
//! 0.72 ms per resource.
//!
//! Three ways, each with fresh names and the resources deleted afterwards:
//! - **sequential**: for each resource, `set_resource`, then submit a task requesting it and
//!   wait for its result, one after another: the latency of one request;
//! - **pipelined**: the same per-resource sequence for every resource, 64 sequences in flight:
//!   the amortised cost per resource when an application creates many;
//! - **batch**: one `set_resources` call with all k updates, one submit of all k tasks, one
//!   wait.

use std::sync::Arc;
use std::time::{Duration, Instant};

use escher::types::{NodeId, NodeSpec, ResourceName, ResourceUpdate};
use escher::{Client, Task};
use escher_client::ResourceUpdateExt;
use serde_json::json;
use tokio::task::JoinSet;

use super::Ctx;
use crate::cluster::{self, NOOP};
use crate::report::{Figure, Line, Plot, PlotData, WorkloadReport};
use crate::stats::Summary;

/// Per-resource sequences in flight in the pipelined mode.
const IN_FLIGHT: usize = 64;
/// The thesis' cost per request at 1,000 resources, in ms.
pub const THESIS_PER_REQUEST_MS: f64 = 1.0;
/// The thesis' amortised cost per resource, in ms.
pub const THESIS_AMORTISED_MS: f64 = 0.72;

/// Runs W4.
pub async fn run(ctx: &Ctx) -> anyhow::Result<WorkloadReport> {
    let nodes = ctx.params.er_nodes;
    let mut report = WorkloadReport::new(
        "w4",
        "ephemeral-resource creation: time until a task requesting each new resource has run",
        ctx.size.as_str(),
    );
    report.setup = json!({
        "nodes": format!("{nodes} in-process workers (worker library), cpu=4 each"),
        "resources": ctx.params.w4_counts,
        "placement": "resource i on node i mod nodes, capacity 1",
        "task": "function task `noop` requesting only the new resource (amount 1)",
        "pipelined_in_flight": IN_FLIGHT,
    });
    let cluster = cluster::start(nodes, "cpu=4").await?;
    let client = cluster.client().await?;
    let ids = cluster.nodes();
    let limit = Duration::from_secs(300);
    // Warm-up: a few resources through every path.
    sequential(&client, &ids, "warm-s", 20, limit).await?;
    pipelined(&client, &ids, "warm-p", 20, limit).await?;

    let mut lines = [Vec::new(), Vec::new(), Vec::new()];
    let mut detail = Vec::new();
    for &k in &ctx.params.w4_counts {
        let seq = sequential(&client, &ids, &format!("s{k}"), k, limit).await?;
        let pipe = pipelined(&client, &ids, &format!("p{k}"), k, limit).await?;
        let batch = batched(&client, &ids, &format!("b{k}"), k, limit).await?;
        let per = |d: Duration| d.as_secs_f64() * 1e3 / k as f64;
        let (seq_ms, pipe_ms, batch_ms) = (per(seq.total), per(pipe), per(batch));
        lines[0].push((k as f64, seq_ms));
        lines[1].push((k as f64, pipe_ms));
        lines[2].push((k as f64, batch_ms));
        let k_text = crate::report::num(k as f64);
        report.figures.push(
            Figure::new(
                format!("w4.sequential.{k}"),
                format!("{k_text} resources, one request at a time: per resource"),
                "ms",
                seq_ms,
            )
            .thesis(THESIS_PER_REQUEST_MS),
        );
        report.figures.push(
            Figure::new(
                format!("w4.pipelined.{k}"),
                format!(
                    "{k_text} resources, {IN_FLIGHT} requests in flight: amortised per resource"
                ),
                "ms",
                pipe_ms,
            )
            .thesis(THESIS_AMORTISED_MS),
        );
        report.figures.push(
            Figure::new(
                format!("w4.batch.{k}"),
                format!("{k_text} resources, one batch call: amortised per resource"),
                "ms",
                batch_ms,
            )
            .thesis(THESIS_AMORTISED_MS),
        );
        detail.push(json!({
            "resources": k,
            "sequential_per_resource_ms": seq_ms,
            "sequential_set_resource_call_ms": seq.set_call,
            "sequential_request_ms": seq.request,
            "pipelined_per_resource_ms": pipe_ms,
            "batch_per_resource_ms": batch_ms,
        }));
    }
    report.detail = json!(detail);
    report.plots.push(Plot {
        file: "fig4.9a-er-creation.png".into(),
        title: "Fig. 4.9a: per-resource creation latency (until a task using it has run)".into(),
        x_label: "ephemeral resources created".into(),
        y_label: "latency per resource (ms)".into(),
        data: PlotData::Lines {
            lines: vec![
                Line {
                    name: "escher, one request at a time".into(),
                    points: lines[0].clone(),
                },
                Line {
                    name: format!("escher, {IN_FLIGHT} in flight"),
                    points: lines[1].clone(),
                },
                Line {
                    name: "escher, one batch call".into(),
                    points: lines[2].clone(),
                },
                Line {
                    name: "thesis (Ray), per request / amortised".into(),
                    points: thesis_curve(&ctx.params.w4_counts),
                },
            ],
            x_log: true,
        },
    });
    drop(client);
    cluster.shutdown().await;
    Ok(report)
}

/// The thesis' figures on the same x values: 1 ms up to 1,000 resources, 0.72 ms beyond.
fn thesis_curve(counts: &[usize]) -> Vec<(f64, f64)> {
    counts
        .iter()
        .map(|&k| {
            let ms = if k <= 1_000 {
                THESIS_PER_REQUEST_MS
            } else {
                THESIS_AMORTISED_MS
            };
            (k as f64, ms)
        })
        .collect()
}

/// The name and node of resource `i` of a run.
fn target(prefix: &str, i: usize, nodes: &[NodeId]) -> anyhow::Result<(ResourceName, NodeId)> {
    let name = ResourceName::new(&format!("w4-{prefix}-{i}"))?;
    Ok((name, nodes[i % nodes.len()]))
}

/// A no-op task requesting one unit of `name`.
fn probe(name: &ResourceName) -> Task {
    Task::function(NOOP, Vec::new()).resource(name.as_str(), 1)
}

/// Creates resource `i`, then runs a task requesting it.
async fn create_and_use(
    client: &Client,
    name: ResourceName,
    node: NodeId,
    limit: Duration,
) -> anyhow::Result<Duration> {
    let start = Instant::now();
    client
        .set_resource(name.as_str(), 1, NodeSpec::Node(node))
        .await?;
    let set = start.elapsed();
    cluster::round_trip(client, probe(&name), limit).await?;
    Ok(set)
}

/// What the sequential mode measured.
struct Sequential {
    total: Duration,
    set_call: Summary,
    request: Summary,
}

async fn sequential(
    client: &Client,
    nodes: &[NodeId],
    prefix: &str,
    k: usize,
    limit: Duration,
) -> anyhow::Result<Sequential> {
    let mut set_calls = Vec::with_capacity(k);
    let mut requests = Vec::with_capacity(k);
    let start = Instant::now();
    for i in 0..k {
        let (name, node) = target(prefix, i, nodes)?;
        let t = Instant::now();
        set_calls.push(create_and_use(client, name, node, limit).await?);
        requests.push(t.elapsed());
    }
    let total = start.elapsed();
    delete_all(client, nodes, prefix, k).await?;
    Ok(Sequential {
        total,
        set_call: Summary::of_ms(&set_calls),
        request: Summary::of_ms(&requests),
    })
}

async fn pipelined(
    client: &Client,
    nodes: &[NodeId],
    prefix: &str,
    k: usize,
    limit: Duration,
) -> anyhow::Result<Duration> {
    let shared = Arc::new(client.clone());
    let mut set = JoinSet::new();
    let start = Instant::now();
    for i in 0..k {
        if set.len() >= IN_FLIGHT
            && let Some(done) = set.join_next().await
        {
            done??;
        }
        let (name, node) = target(prefix, i, nodes)?;
        let c = Arc::clone(&shared);
        set.spawn(async move { create_and_use(&c, name, node, limit).await });
    }
    while let Some(done) = set.join_next().await {
        done??;
    }
    let total = start.elapsed();
    delete_all(client, nodes, prefix, k).await?;
    Ok(total)
}

async fn batched(
    client: &Client,
    nodes: &[NodeId],
    prefix: &str,
    k: usize,
    limit: Duration,
) -> anyhow::Result<Duration> {
    let mut updates = Vec::with_capacity(k);
    let mut tasks = Vec::with_capacity(k);
    for i in 0..k {
        let (name, node) = target(prefix, i, nodes)?;
        tasks.push(probe(&name));
        updates.push(ResourceUpdate::set(name.as_str(), 1, NodeSpec::Node(node))?);
    }
    let start = Instant::now();
    client.set_resources(updates).await?;
    let ids = cluster::submit_all(client, tasks).await?;
    cluster::wait_all(client, &ids, limit).await?;
    let total = start.elapsed();
    delete_all(client, nodes, prefix, k).await?;
    Ok(total)
}

/// Deletes the k resources of a run, in one call.
async fn delete_all(
    client: &Client,
    nodes: &[NodeId],
    prefix: &str,
    k: usize,
) -> anyhow::Result<()> {
    let mut updates = Vec::with_capacity(k);
    for i in 0..k {
        let (name, node) = target(prefix, i, nodes)?;
        updates.push(ResourceUpdate::delete(name.as_str(), NodeSpec::Node(node))?);
    }
    for chunk in updates.chunks(10_000) {
        client.set_resources(chunk.to_vec()).await?;
    }
    Ok(())
}
