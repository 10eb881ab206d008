//! W5 makespan against resources present (thesis Fig. 4.9b): the makespan of 10,000 no-op
//! tasks that request no ephemeral resource, with 0, 10^3, 10^4 and 10^5 unrelated ephemeral
//! resources in the cluster (spread evenly over the nodes). The thesis: flat. Each makespan
//! is measured several times and the median reported; resources are added between counts, so
//! the cluster holds exactly the stated number during each measurement.

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

    let mut present = 0;
    let mut points = Vec::new();
    let mut detail = Vec::new();
    let mut baseline = None;
    for &count in &p.w5_resources {
        fill(&client, &node_ids, present, count).await?;
        present = present.max(count);
        let mut samples = Vec::new();
        for _ in 0..p.w5_repeats {
            let wall = cluster::run_batch(&client, tasks(p.w5_tasks), limit).await?;
            samples.push(wall.as_secs_f64());
        }
        let makespan = median(&samples);
        let base = *baseline.get_or_insert(makespan);
        points.push((count as f64, makespan));
        report.figures.push(Figure::new(
            format!("w5.makespan.{count}"),
            format!(
                "makespan of {} tasks, {} resources present (× {:.3} of none)",
                crate::report::num(p.w5_tasks as f64),
                crate::report::num(count as f64),
                makespan / base
            ),
            "s",
            makespan,
        ));
        detail.push(json!({"resources": count, "makespan_s": samples, "median_s": makespan}));
    }
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

fn tasks(n: usize) -> Vec<Task> {
    (0..n).map(|_| noop()).collect()
}

/// Creates resources `from..to` (resource i on node i mod nodes).
async fn fill(client: &Client, nodes: &[NodeId], from: usize, to: usize) -> anyhow::Result<()> {
    let mut updates = Vec::with_capacity(FILL_BATCH);
    for i in from..to {
        let node = nodes[i % nodes.len()];
        updates.push(ResourceUpdate::set(
            format!("w5-er-{i}").as_str(),
            1,
            NodeSpec::Node(node),
        )?);
        if updates.len() == FILL_BATCH {
            client.set_resources(std::mem::take(&mut updates)).await?;
        }
    }
    client.set_resources(updates).await?;
    Ok(())
}
