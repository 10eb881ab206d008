//! W6 scheduling latency against resources requested (thesis Fig. 4.9c): 50 nodes, 1,000
//! ephemeral resources (each on every node, so that a task requesting 100 of them fits a
//! node), and tasks requesting 1, 10, 50 and 100 of them. The latency is the sequential
//! submit-then-get round trip of a no-op task, as W2 measures it; the thesis: 1.1 → 1.2 ms for
//! 1 vs 100 requested. The same setup is also fed to the pure scheduler core in this
//! process (no gRPC, no worker), to show what the scheduling decision itself costs.

use std::time::Duration;

use std::time::Instant;

use escher::Task;
use escher::types::{
    Amount, Capacity, CapacityOp, Labels, NodeId, NodeSpec, ResourceName, ResourceSet,
    ResourceUpdate, TaskId,
};
use escher_client::ResourceUpdateExt;
use escher_core::scheduler::{Event, Scheduler};
use serde_json::json;

use super::Ctx;
use crate::cluster::{self, NOOP};
use crate::report::{Figure, Line, Plot, PlotData, WorkloadReport};
use crate::stats::Summary;

/// Round trips per requested count run first and not counted.
const WARMUP: usize = 20;
/// The capacity of each resource on each node: never the limit.
const CAPACITY: u64 = 1_000_000;
/// The thesis' latency for 1 and 100 requested resources, in ms.
pub const THESIS_MS: [(usize, f64); 2] = [(1, 1.1), (100, 1.2)];

/// Runs W6.
pub async fn run(ctx: &Ctx) -> anyhow::Result<WorkloadReport> {
    let p = &ctx.params;
    let nodes = p.er_nodes;
    let mut report = WorkloadReport::new(
        "w6",
        "scheduling latency against ephemeral resources requested per task",
        ctx.size.as_str(),
    );
    report.setup = json!({
        "nodes": format!("{nodes} in-process workers, cpu=4 each"),
        "resources": p.w6_resources,
        "placement": format!("every resource on every node (capacity {CAPACITY})"),
        "task": "function task `noop`, cpu=1 plus 1 unit of each of the first K resources",
        "requested": p.w6_requested,
        "round_trips_per_k": p.w6_tasks,
    });
    let cluster = cluster::start(nodes, "cpu=4").await?;
    let client = cluster.client().await?;
    let everywhere = NodeSpec::Match {
        resources: ResourceSet::new(),
        num_nodes: None,
    };
    let updates = (0..p.w6_resources)
        .map(|i| ResourceUpdate::set(format!("w6-er-{i}").as_str(), CAPACITY, everywhere.clone()))
        .collect::<Result<Vec<_>, _>>()?;
    client.set_resources(updates).await?;

    let limit = Duration::from_secs(30);
    let mut points = Vec::new();
    let mut detail = Vec::new();
    for &k in &p.w6_requested {
        let k = k.min(p.w6_resources);
        let task = || {
            let mut t = Task::function(NOOP, Vec::new()).resource("cpu", 1);
            for i in 0..k {
                t = t.resource(format!("w6-er-{i}").as_str(), 1);
            }
            t
        };
        for _ in 0..WARMUP {
            cluster::round_trip(&client, task(), limit).await?;
        }
        let mut samples = Vec::with_capacity(p.w6_tasks);
        for _ in 0..p.w6_tasks {
            samples.push(cluster::round_trip(&client, task(), limit).await?);
        }
        let s = Summary::of_ms(&samples);
        points.push((k as f64, s.p50));
        let mut fig = Figure::new(
            format!("w6.p50.{k}"),
            format!(
                "task requesting {k} ephemeral resource{}: round trip p50",
                if k == 1 { "" } else { "s" }
            ),
            "ms",
            s.p50,
        );
        if let Some(&(_, ms)) = THESIS_MS.iter().find(|(n, _)| *n == k) {
            fig = fig.thesis(ms);
        }
        report.figures.push(fig);
        let core_us = core_cycle_us(nodes, p.w6_resources, k, p.w6_tasks * 20)?;
        report.figures.push(Figure::new(
            format!("w6.core.{k}"),
            format!("  scheduler core alone: submit, dispatch, finish of a task requesting {k}"),
            "µs",
            core_us,
        ));
        detail.push(json!({"requested": k, "round_trip_ms": s, "core_cycle_us": core_us}));
    }
    report.detail = json!(detail);
    report.plots.push(Plot {
        file: "fig4.9c-requested.png".into(),
        title: format!(
            "Fig. 4.9c: scheduling latency vs ephemeral resources requested ({} present)",
            crate::report::num(p.w6_resources as f64)
        ),
        x_label: "ephemeral resources requested per task".into(),
        y_label: "submit-to-result latency, p50 (ms)".into(),
        data: PlotData::Lines {
            lines: vec![
                Line {
                    name: format!("escher, {nodes} nodes"),
                    points,
                },
                Line {
                    name: "thesis (Ray)".into(),
                    points: THESIS_MS.iter().map(|&(k, ms)| (k as f64, ms)).collect(),
                },
            ],
            x_log: true,
        },
    });
    drop(client);
    cluster.shutdown().await;
    Ok(report)
}

/// The mean time of one submit-dispatch-finish cycle of a task requesting `k` of `resources`
/// ephemeral resources (each on every one of `nodes` nodes), in the pure scheduler core.
fn core_cycle_us(nodes: usize, resources: usize, k: usize, cycles: usize) -> anyhow::Result<f64> {
    let mut core = Scheduler::new();
    let mut out = Vec::new();
    for n in 0..nodes {
        let cpu = vec![(ResourceName::cpu(), Capacity::Finite(Amount::units(4)?))];
        let node = NodeId(n as u64 + 1);
        core.handle(
            Event::NodeAdded {
                node,
                resources: cpu,
                labels: Labels::new(),
            },
            0,
            &mut out,
        )?;
    }
    for i in 0..resources {
        let name = ResourceName::new(&format!("w6-er-{i}"))?;
        for n in 0..nodes {
            let op = CapacityOp::Set(Capacity::Finite(Amount::units(CAPACITY)?));
            core.handle(
                Event::ResourceChanged {
                    target: NodeSpec::Node(NodeId(n as u64 + 1)),
                    name: name.clone(),
                    op,
                },
                0,
                &mut out,
            )?;
        }
    }
    let mut req: ResourceSet = "cpu=1".parse()?;
    for i in 0..k {
        req.insert(ResourceName::new(&format!("w6-er-{i}"))?, Amount::ONE);
    }
    out.clear();
    let start = Instant::now();
    for t in 0..cycles {
        let task = TaskId(t as u64 + 1);
        core.handle(
            Event::TaskSubmitted {
                task,
                resources: req.clone(),
                deadline: None,
                time_limit: None,
            },
            0,
            &mut out,
        )?;
        core.handle(Event::TaskFinished { task }, 0, &mut out)?;
        out.clear();
    }
    Ok(start.elapsed().as_secs_f64() * 1e6 / cycles.max(1) as f64)
}
