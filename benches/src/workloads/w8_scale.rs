//! W8 scale: one head with 1,000 nodes and 1,000,000 queued tasks.
//!
//! The head is the real `escher-head` binary in its own process, so that its memory can be read
//! from `/proc/PID/status`. The nodes are light simulated workers in this process (`sim.rs`):
//! a tokio task each, speaking the real `WorkerLink` protocol over a shared HTTP/2 connection,
//! with `cpu=1`. The steps:
//!
//! 1. start the head and read its resident memory (VmRSS); attach the nodes and read it again;
//! 2. **submit** the tasks from one client (function tasks holding one CPU, 10,000 per call)
//!    while the simulated nodes hold what they are given: one task runs per node and the rest
//!    queue. Submission rate; then VmRSS again: **memory per queued task** is the growth over
//!    the number of tasks held;
//! 3. **drain**: the nodes finish every task at once from now on; the head releases, dispatches
//!    the next queued task, sends it, and so on until none is left. Wall time and the head's
//!    CPU time per task give the end-to-end head cost per scheduling decision;
//! 4. **metrics**: every node gets `RESOURCES_PER_NODE` more resources (10^5 at 1,000 nodes),
//!    and `/metrics` (`--metrics`) is scraped `SCRAPES` times: the median time of a whole
//!    scrape over plain HTTP, and its size;
//! 5. the same 1,000 nodes and 1,000,000 tasks fed to the pure scheduler core in this process:
//!    **scheduler time per decision** (a task finishes, the next one is dispatched), with no
//!    gRPC around it.

use std::collections::VecDeque;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use escher::types::{
    Amount, Capacity, Labels, NodeId, NodeSpec, ResourceName, ResourceSet, TaskId,
};
use escher::{Client, Task};
use escher_client::ResourceUpdateExt;
use escher_core::scheduler::{Decision, Event, Scheduler};
use serde_json::json;

use super::Ctx;
use crate::cluster::NOOP;
use crate::head_process::{HeadProcess, find_head_bin};
use crate::report::{Figure, WorkloadReport};
use crate::sim::SimCluster;

/// Tasks per `Submit` call.
const SUBMIT_BATCH: usize = 10_000;
/// Simulated nodes sharing one HTTP/2 connection.
const NODES_PER_CHANNEL: usize = 1_000;
/// The longest any step may take.
const STEP_LIMIT: Duration = Duration::from_secs(600);
/// Resources each node gets before `/metrics` is scraped.
const RESOURCES_PER_NODE: usize = 100;
/// Scrapes of `/metrics`, of which the median is reported.
const SCRAPES: usize = 5;

/// Runs W8.
pub async fn run(ctx: &Ctx) -> anyhow::Result<WorkloadReport> {
    let nodes = ctx.params.w8_nodes;
    let tasks = ctx.params.w8_tasks;
    let mut report = WorkloadReport::new(
        "w8",
        "scale: simulated nodes and queued tasks in one head process",
        ctx.size.as_str(),
    );
    let bin = find_head_bin(ctx.head_bin.as_deref())?;
    report.setup = json!({
        "head": format!("{} as a separate process", bin.display()),
        "nodes": format!(
            "{nodes} simulated workers (a tokio task each, real WorkerLink protocol, {} per HTTP/2 connection), cpu=1 each",
            NODES_PER_CHANNEL.min(nodes)
        ),
        "tasks": tasks,
        "task": "function task, cpu=1; nodes hold their task until the drain starts",
        "submit_batch": SUBMIT_BATCH,
    });
    let metrics_addr = std::net::TcpListener::bind("127.0.0.1:0")?.local_addr()?;
    let metrics_flag = metrics_addr.to_string();
    let head = HeadProcess::start(
        &bin,
        &[
            "--heartbeat-interval-ms",
            "1000",
            "--heartbeat-timeout-ms",
            "120000",
            "--metrics",
            &metrics_flag,
        ],
    )
    .await?;
    tokio::time::sleep(Duration::from_millis(300)).await;
    let rss_empty = head.rss_kib()?;

    let sim = SimCluster::start(
        head.url(),
        nodes,
        "cpu=1".parse()?,
        NODES_PER_CHANNEL,
        STEP_LIMIT,
    )
    .await?;
    let client = Client::connect(head.url()).await?;
    let status = client.cluster_status().await?;
    let alive = status.nodes.iter().filter(|n| n.alive).count();
    if alive != nodes {
        bail!("the head sees {alive} live nodes, not {nodes}");
    }
    tokio::time::sleep(Duration::from_millis(500)).await;
    let rss_nodes = head.rss_kib()?;

    // Submit.
    let start = Instant::now();
    let mut submitted = 0;
    while submitted < tasks {
        let n = SUBMIT_BATCH.min(tasks - submitted);
        let batch = (0..n).map(|_| Task::function(NOOP, Vec::new()).resource("cpu", 1));
        client.submit_batch(batch).await?;
        submitted += n;
    }
    let submit_wall = start.elapsed();
    let held = nodes.min(tasks);
    settle(&client, (tasks - held) as u64, held as u64).await?;
    tokio::time::sleep(Duration::from_millis(500)).await;
    let rss_queued = head.rss_kib()?;
    let peak_queued = head.peak_rss_kib()?;

    // Drain.
    let cpu_before = head.cpu_seconds()?;
    let head_bytes_before = sim.counters().head_bytes.load(Ordering::Relaxed);
    let node_bytes_before = sim.counters().node_bytes.load(Ordering::Relaxed);
    let start = Instant::now();
    sim.open_gate();
    while sim.counters().finished.load(Ordering::Relaxed) < tasks as u64 {
        if start.elapsed() > STEP_LIMIT {
            bail!(
                "only {} of {tasks} tasks finished within {STEP_LIMIT:?}",
                sim.counters().finished.load(Ordering::Relaxed)
            );
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    settle(&client, 0, 0).await?;
    let drain_wall = start.elapsed();
    let drain_cpu = head.cpu_seconds()? - cpu_before;
    // The link's bytes per task in the drain (heartbeats included, a few hundred in all).
    let per_drained = |now: u64, before: u64| now.saturating_sub(before) as f64 / tasks as f64;
    let head_bytes = per_drained(
        sim.counters().head_bytes.load(Ordering::Relaxed),
        head_bytes_before,
    );
    let node_bytes = per_drained(
        sim.counters().node_bytes.load(Ordering::Relaxed),
        node_bytes_before,
    );
    let rss_drained = head.rss_kib()?;
    let peak = head.peak_rss_kib()?;

    // Metrics, with RESOURCES_PER_NODE more resources on every node.
    let node_ids: Vec<NodeId> = status.nodes.iter().map(|n| n.id).collect();
    let mut updates = Vec::new();
    for node in &node_ids {
        for i in 0..RESOURCES_PER_NODE {
            let name = format!("m-{i}");
            let update = escher::types::ResourceUpdate::set(&name, 1, NodeSpec::Node(*node))?;
            updates.push(update);
            if updates.len() == SUBMIT_BATCH {
                client.set_resources(std::mem::take(&mut updates)).await?;
            }
        }
    }
    client.set_resources(updates).await?;
    let token = head.admin_token().to_string();
    let scrapes = tokio::task::spawn_blocking(move || {
        (0..SCRAPES)
            .map(|_| scrape_metrics(metrics_addr, &token))
            .collect::<anyhow::Result<Vec<(Duration, usize)>>>()
    })
    .await??;
    let mut scrape_times: Vec<Duration> = scrapes.iter().map(|(t, _)| *t).collect();
    scrape_times.sort();
    let scrape_median = scrape_times[SCRAPES / 2];
    let scrape_bytes = scrapes.last().map_or(0, |(_, b)| *b);
    let resources_total = node_ids.len() * (RESOURCES_PER_NODE + 1);
    drop(client);
    let sim_result = sim.stop().await;
    head.stop().await;
    sim_result.context("a simulated node failed")?;

    // The pure core at the same scale.
    let core = tokio::task::spawn_blocking(move || core_decisions(nodes, tasks)).await??;

    let submit_rate = tasks as f64 / submit_wall.as_secs_f64();
    let per_task_bytes = (rss_queued.saturating_sub(rss_nodes)) as f64 * 1024.0 / tasks as f64;
    let drain_rate = tasks as f64 / drain_wall.as_secs_f64();
    let t = crate::report::num(tasks as f64);
    let n_text = crate::report::num(nodes as f64);
    report.figures.push(Figure::new(
        "w8.submit_rate",
        format!("submission of {t} tasks to a head with {n_text} nodes, one client"),
        "tasks/s",
        submit_rate,
    ));
    report.figures.push(Figure::new(
        "w8.memory_per_task",
        format!("head memory per queued task (VmRSS growth / {t})"),
        "bytes",
        per_task_bytes,
    ));
    report.figures.push(Figure::new(
        "w8.drain_per_decision",
        format!("drain of {t} queued tasks over {n_text} nodes: head wall time per decision"),
        "µs",
        drain_wall.as_secs_f64() * 1e6 / tasks as f64,
    ));
    report.figures.push(Figure::new(
        "w8.drain_cpu_per_decision",
        "drain: head CPU time per decision (schedule, Assign out, 2 reports in)",
        "µs",
        drain_cpu * 1e6 / tasks as f64,
    ));
    report.figures.push(Figure::new(
        "w8.link_bytes_to_node",
        "drain: head → node link bytes per task (encoded batches: Assign, acks)",
        "bytes",
        head_bytes,
    ));
    report.figures.push(Figure::new(
        "w8.link_bytes_to_head",
        "drain: node → head link bytes per task (encoded batches: TaskStarted, TaskFinished)",
        "bytes",
        node_bytes,
    ));
    report.figures.push(Figure::new(
        "w8.metrics_scrape",
        format!(
            "one scrape of /metrics with {n_text} nodes and {} resources (median of {SCRAPES})",
            crate::report::num(resources_total as f64)
        ),
        "ms",
        scrape_median.as_secs_f64() * 1e3,
    ));
    report.figures.push(Figure::new(
        "w8.core_per_decision",
        format!("scheduler core alone, {n_text} nodes, {t} queued: time per decision"),
        "µs",
        core.decision_us,
    ));
    report.detail = json!({
        "rss_kib": {
            "empty_head": rss_empty,
            "with_nodes": rss_nodes,
            "with_tasks_queued": rss_queued,
            "peak_while_queued": peak_queued,
            "after_drain": rss_drained,
            "peak": peak,
        },
        "submit_s": submit_wall.as_secs_f64(),
        "submit_tasks_per_s": submit_rate,
        "drain_s": drain_wall.as_secs_f64(),
        "drain_tasks_per_s": drain_rate,
        "drain_head_cpu_s": drain_cpu,
        "metrics": {
            "resources": resources_total,
            "scrape_ms": scrape_times.iter().map(|t| t.as_secs_f64() * 1e3).collect::<Vec<_>>(),
            "bytes": scrape_bytes,
        },
        "core": {
            "submit_us_per_task": core.submit_us,
            "decision_us": core.decision_us,
            "decisions": core.decisions,
        },
    });
    report.notes.push(format!(
        "Memory per task counts every task the head held at the reading: {} queued and {held} \
         running (one per node). Resident memory includes what the allocator keeps after \
         decoding the submit calls, so it is an upper bound on the task records themselves.",
        tasks - held
    ));
    Ok(report)
}

/// One `GET /metrics` over plain HTTP (a new connection) with the admin token: how long the
/// whole response took, and the size of its body.
fn scrape_metrics(addr: std::net::SocketAddr, token: &str) -> anyhow::Result<(Duration, usize)> {
    let start = Instant::now();
    let mut response = ureq::get(format!("http://{addr}/metrics"))
        .header("Authorization", format!("Bearer {token}"))
        .call()
        .context("the metrics scrape failed")?;
    let body = response
        .body_mut()
        .with_config()
        .limit(u64::MAX)
        .read_to_vec()
        .context("reading the metrics")?;
    Ok((start.elapsed(), body.len()))
}

/// Waits until the head reports `pending` pending and `running` running tasks.
pub(crate) async fn settle(client: &Client, pending: u64, running: u64) -> anyhow::Result<()> {
    let start = Instant::now();
    loop {
        let s = client.cluster_status().await?;
        if s.pending_tasks == pending && s.running_tasks == running {
            return Ok(());
        }
        if start.elapsed() > STEP_LIMIT {
            bail!(
                "the head shows {} pending and {} running, not {pending} and {running}",
                s.pending_tasks,
                s.running_tasks
            );
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// What the pure core measured.
#[derive(Debug)]
struct CoreFigures {
    submit_us: f64,
    decision_us: f64,
    decisions: u64,
}

/// Feeds `tasks` single-CPU tasks to a core with `nodes` 1-CPU nodes, then finishes them one at
/// a time, each finish dispatching the next queued task on the freed node.
fn core_decisions(nodes: usize, tasks: usize) -> anyhow::Result<CoreFigures> {
    let mut core = Scheduler::new();
    let mut out = Vec::new();
    for i in 0..nodes {
        let cpu = vec![(ResourceName::cpu(), Capacity::Finite(Amount::units(1)?))];
        core.handle(
            Event::NodeAdded {
                node: NodeId(i as u64 + 1),
                resources: cpu,
                labels: Labels::new(),
            },
            0,
            &mut out,
        )?;
    }
    let req: ResourceSet = "cpu=1".parse()?;
    let start = Instant::now();
    for i in 0..tasks {
        core.handle(
            Event::TaskSubmitted {
                task: TaskId(i as u64 + 1),
                resources: req.clone(),
                deadline: None,
                time_limit: None,
            },
            0,
            &mut out,
        )?;
    }
    let submit = start.elapsed();
    let mut running: VecDeque<TaskId> = VecDeque::new();
    let collect = |out: &mut Vec<Decision>, running: &mut VecDeque<TaskId>| {
        let mut n = 0;
        for d in out.drain(..) {
            if let Decision::Dispatch { task, .. } = d {
                running.push_back(task);
                n += 1;
            }
        }
        n
    };
    collect(&mut out, &mut running);
    let mut decisions = 0u64;
    let start = Instant::now();
    while let Some(task) = running.pop_front() {
        core.handle(Event::TaskFinished { task }, 0, &mut out)?;
        decisions += collect(&mut out, &mut running);
    }
    let drain = start.elapsed();
    Ok(CoreFigures {
        submit_us: submit.as_secs_f64() * 1e6 / tasks.max(1) as f64,
        decision_us: drain.as_secs_f64() * 1e6 / decisions.max(1) as f64,
        decisions,
    })
}
