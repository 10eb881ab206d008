//! W5 makespan against resources present (thesis Fig. 4.9b): the makespan of no-op tasks
//! that request no ephemeral resource, with 0, 10^3, 10^4 and 10^5 unrelated ephemeral
//! resources in the cluster (spread evenly over the nodes). The thesis: flat. Each count is
//! measured in pairs, several times: the makespan with the resources present, then, every one
//! of them deleted, the makespan with none. The median of the pairs' ratios is the count's
//! cost, so that the machine's drift over the run (and the finished tasks the head keeps) is
//! not read as the resources'.

use std::time::Duration;

use escher::types::{NodeId, NodeSpec, ResourceUpdate};
use escher::{Client, Task};
use escher_client::ResourceUpdateExt;
use serde_json::json;

use super::Ctx;
use crate::cluster::{self, noop};
use crate::report::{Figure, Line, Plot, PlotData, WorkloadReport};
use crate::stats::median;

/// Updates per `set_resources` call while filling the table.
const FILL_BATCH: usize = 10_000;

/// Runs W5.
pub async fn run(ctx: &Ctx) -> anyhow::Result<WorkloadReport> {
    let p = &ctx.params;
    let nodes = p.er_nodes;
    let mut report = WorkloadReport::new(
        "w5",
        "makespan of no-op tasks against unrelated ephemeral resources present",
        ctx.size.as_str(),
    );
    report.setup = json!({
        "nodes": format!("{nodes} in-process workers, cpu=4 each"),
        "tasks": p.w5_tasks,
        "task": "function task `noop`, cpu=1 (no ephemeral resource)",
        "resources_present": p.w5_resources,
        "placement": "resource i on node i mod nodes, capacity 1",
        "repeats": p.w5_repeats,
    });
    let cluster = cluster::start(nodes, "cpu=4").await?;
    let client = cluster.client().await?;
    let node_ids = cluster.nodes();
    let limit = Duration::from_secs(600);
    cluster::run_batch(&client, tasks(500), limit).await?;

    // Each count is measured in pairs: the makespan with the resources present, then (all
    // deleted) the makespan with none, so that the machine's drift over the run is not read as
    // the resources' cost; the ratio of a pair is judged, and its median reported.
    let mut none = Vec::new();
    let mut measured = Vec::new();
    let mut detail = Vec::new();
    for &count in p.w5_resources.iter().filter(|&&count| count > 0) {
        let (mut with, mut ratios) = (Vec::new(), Vec::new());
        for _ in 0..p.w5_repeats {
            fill(&client, &node_ids, count).await?;
            let present = makespan(&client, p.w5_tasks, limit).await?;
            empty(&client, &node_ids, count).await?;
            let absent = makespan(&client, p.w5_tasks, limit).await?;
            with.push(present);
            none.push(absent);
            ratios.push(present / absent);
        }
        detail.push(json!({"resources": count, "makespan_s": with, "ratio_to_none": ratios}));
        measured.push((count, median(&with), median(&ratios)));
    }
    detail.push(json!({"resources": 0, "makespan_s": none}));
    let tasks_text = crate::report::num(p.w5_tasks as f64);
    let none = median(&none);
    report.figures.push(Figure::new(
        "w5.makespan.0",
        format!("makespan of {tasks_text} tasks, 0 resources present"),
        "s",
        none,
    ));
    for &(count, makespan, ratio) in &measured {
        let count_text = crate::report::num(count as f64);
        report.figures.push(Figure::new(
            format!("w5.makespan.{count}"),
            format!("makespan of {tasks_text} tasks, {count_text} resources present"),
            "s",
            makespan,
        ));
        report.figures.push(Figure::new(
            format!("w5.ratio.{count}"),
            format!(
                "makespan with {count_text} resources ÷ the run with none right after it, median \
                 of {} pairs",
                p.w5_repeats
            ),
            "×",
            ratio,
        ));
    }
    let points: Vec<(f64, f64)> = std::iter::once((0.0, none))
        .chain(measured.iter().map(|&(c, m, _)| (c as f64, m)))
        .collect();
    report.detail = json!(detail);
    report.plots.push(Plot {
        file: "fig4.9b-makespan.png".into(),
        title: format!(
            "Fig. 4.9b: makespan of {} no-op tasks vs ephemeral resources present",
            crate::report::num(p.w5_tasks as f64)
        ),
        x_label: "ephemeral resources in the cluster (0 plotted at 1)".into(),
        y_label: "makespan (s)".into(),
        data: PlotData::Lines {
            lines: vec![Line {
                name: format!("escher, {nodes} nodes"),
                points: points.iter().map(|&(x, y)| (x.max(1.0), y)).collect(),
            }],
            x_log: true,
        },
    });
    drop(client);
    cluster.shutdown().await;
    Ok(report)
}

/// The makespan of `tasks_per_run` no-op tasks, in seconds.
async fn makespan(client: &Client, tasks_per_run: usize, limit: Duration) -> anyhow::Result<f64> {
    let wall = cluster::run_batch(client, tasks(tasks_per_run), limit).await?;
    Ok(wall.as_secs_f64())
}

fn tasks(n: usize) -> Vec<Task> {
    (0..n).map(|_| noop()).collect()
}

/// Creates resources `0..count` (resource i on node i mod nodes).
async fn fill(client: &Client, nodes: &[NodeId], count: usize) -> anyhow::Result<()> {
    change(client, nodes, 0..count, |name, node| {
        ResourceUpdate::set(name, 1, node)
    })
    .await
}

/// Deletes resources `0..count`.
async fn empty(client: &Client, nodes: &[NodeId], count: usize) -> anyhow::Result<()> {
    change(client, nodes, 0..count, |name, node| {
        ResourceUpdate::delete(name, node)
    })
    .await
}

/// Sends `update` of resource i on node i mod nodes, for each i in `range`, in batches.
async fn change(
    client: &Client,
    nodes: &[NodeId],
    range: std::ops::Range<usize>,
    update: impl Fn(&str, NodeSpec) -> Result<ResourceUpdate, escher::ClientError>,
) -> anyhow::Result<()> {
    let mut updates = Vec::with_capacity(FILL_BATCH);
    for i in range {
        let node = nodes[i % nodes.len()];
        updates.push(update(format!("w5-er-{i}").as_str(), NodeSpec::Node(node))?);
        if updates.len() == FILL_BATCH {
            client.set_resources(std::mem::take(&mut updates)).await?;
        }
    }
    client.set_resources(updates).await?;
    Ok(())
}
