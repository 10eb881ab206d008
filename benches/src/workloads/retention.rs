//! Retention: the head's memory under a never-ending stream of short tasks, which must stay
//! bounded (docs/DESIGN.md §7).
//!
//! The head is the real `escher-head` binary in its own process, so that its resident memory
//! can be read from `/proc/PID/status`; the nodes are the light simulated workers of `sim.rs`,
//! which finish every task the moment they get it. No-op function tasks go in batches (one
//! `Submit` call each) with a bounded number unfinished at a time; every so many tasks the
//! stream pauses until the head has finished all of them, and its VmRSS is read.
//! The same stream runs twice, each against a fresh head:
//!
//! 1. **keep everything** (`--retain-finished 1000000000 --retain-for 100years`): the slope of
//!    RSS against finished tasks (least squares over the second half of the run, past the
//!    allocator's warm-up) is the head's **memory per retained finished task**;
//! 2. **retention** (`--retain-finished 1000`, so 10,000 tombstones): RSS should stay flat once
//!    the first 1,000 + 10,000 tasks have filled what is kept. Reported: the growth from the
//!    reading after the first 10,000 tasks to the last one.
//!
//! Both lines go into one plot. [`push`] is also what the retention test runs.

use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use escher::{Client, Task};
use serde_json::json;

use super::Ctx;
use crate::cluster::NOOP;
use crate::head_process::{HeadProcess, find_head_bin};
use crate::report::{Figure, Line, Plot, PlotData, WorkloadReport};
use crate::sim::SimCluster;
use crate::workloads::w8_scale::settle;

/// Simulated nodes; they take any number of tasks at once (the tasks request nothing).
const NODES: usize = 4;
/// How long one batch may take to run to the end.
const BATCH_LIMIT: Duration = Duration::from_secs(300);
/// The finished-task retention of the second run.
pub const RETAIN: usize = 1_000;
/// The reading the flat line is measured from: after this many tasks.
pub const FLAT_FROM: u64 = 10_000;

/// The head flags that keep every finished task.
pub const KEEP_ALL: [&str; 4] = [
    "--retain-finished",
    "1000000000",
    "--retain-for",
    "100years",
];

/// One reading: tasks finished so far, and the head's resident memory then, in KiB.
pub type Sample = (u64, u64);

/// A head process with simulated nodes and a client, ready for a stream of tasks.
#[derive(Debug)]
pub struct Stream {
    /// The head process.
    pub head: HeadProcess,
    /// A client connected to it.
    pub client: Client,
    sim: SimCluster,
}

impl Stream {
    /// Starts `escher-head` (found as the harness finds it) with `flags`, and its nodes.
    pub async fn start(
        head_bin: Option<&std::path::Path>,
        flags: &[&str],
    ) -> anyhow::Result<Stream> {
        let bin = find_head_bin(head_bin)?;
        let mut args = vec!["--heartbeat-timeout-ms", "120000"];
        args.extend_from_slice(flags);
        let head = HeadProcess::start(&bin, &args).await?;
        let sim =
            SimCluster::start(head.url(), NODES, "cpu=1".parse()?, NODES, BATCH_LIMIT).await?;
        // Open from the start: every task finishes the moment its node gets it.
        sim.open_gate();
        let client = Client::connect(head.url()).await?;
        Ok(Stream { head, client, sim })
    }

    /// Stops the nodes and the head.
    pub async fn stop(self) -> anyhow::Result<()> {
        drop(self.client);
        let nodes = self.sim.stop().await;
        self.head.stop().await;
        nodes.context("a simulated node failed")
    }
}

/// Pushes `total` no-op tasks through the stream's head, `batch` per `Submit` call, with at
/// most `window` of them unfinished on the nodes at any time; every `every` tasks (and at the
/// end) it lets the head finish all of them and reads its VmRSS.
pub async fn push(
    stream: &Stream,
    total: usize,
    batch: usize,
    window: usize,
    every: usize,
) -> anyhow::Result<Vec<Sample>> {
    let mut samples = Vec::new();
    let mut submitted = 0;
    let mut next_sample = every.min(total);
    while submitted < total {
        let n = batch.min(total - submitted).min(next_sample - submitted);
        // No resources at all (not the default CPU): the stream measures the head's memory,
        // not a queue behind the nodes' CPUs.
        let tasks = (0..n).map(|_| Task::function(NOOP, Vec::new()).resources(Default::default()));
        stream.client.submit_batch(tasks).await?;
        submitted += n;
        if submitted == next_sample {
            settle(&stream.client, 0, 0).await?;
            samples.push((submitted as u64, stream.head.rss_kib()?));
            next_sample = (next_sample + every).min(total);
            continue;
        }
        let start = Instant::now();
        let finished = || stream.sim.counters().finished.load(Ordering::Relaxed) as usize;
        while submitted - finished().min(submitted) > window {
            if start.elapsed() > BATCH_LIMIT {
                bail!("the nodes finished no task for {BATCH_LIMIT:?}");
            }
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
    }
    Ok(samples)
}

/// The least-squares slope of `samples` (KiB per task) in bytes per task.
pub fn slope_bytes(samples: &[Sample]) -> f64 {
    let n = samples.len() as f64;
    if samples.len() < 2 {
        return 0.0;
    }
    let mx = samples.iter().map(|s| s.0 as f64).sum::<f64>() / n;
    let my = samples.iter().map(|s| s.1 as f64).sum::<f64>() / n;
    let (num, den) = samples.iter().fold((0.0, 0.0), |(num, den), s| {
        let dx = s.0 as f64 - mx;
        (num + dx * (s.1 as f64 - my), den + dx * dx)
    });
    if den == 0.0 { 0.0 } else { num / den * 1024.0 }
}

/// The first reading at or after `tasks` finished tasks.
pub fn reading_at(samples: &[Sample], tasks: u64) -> Option<Sample> {
    samples.iter().copied().find(|s| s.0 >= tasks)
}

/// Runs the retention workload.
pub async fn run(ctx: &Ctx) -> anyhow::Result<WorkloadReport> {
    let total = ctx.params.retention_tasks;
    let batch = ctx.params.retention_batch;
    let mut report = WorkloadReport::new(
        "retention",
        "head memory under a stream of short tasks: keep everything vs --retain-finished 1000",
        ctx.size.as_str(),
    );
    report.setup = json!({
        "head": "escher-head as a separate process, VmRSS from /proc/PID/status after every batch",
        "nodes": format!("{NODES} simulated workers (real WorkerLink protocol) finishing every task at once"),
        "tasks": total,
        "task": "no-op function task requesting nothing",
        "batch": batch,
        "in_flight": format!("at most {} tasks unfinished on the nodes", 4 * batch),
        "rss_read_every": ctx.params.retention_every,
        "keep_all_flags": KEEP_ALL.join(" "),
        "retention_flags": format!("--retain-finished {RETAIN} (tombstones: ten times that)"),
    });

    let window = 4 * batch;
    let every = ctx.params.retention_every;
    let keep_all = Stream::start(ctx.head_bin.as_deref(), &KEEP_ALL).await?;
    let start = Instant::now();
    let all = push(&keep_all, total, batch, window, every).await;
    let all_wall = start.elapsed();
    keep_all.stop().await?;
    let all = all?;

    let retain = RETAIN.to_string();
    let kept = Stream::start(ctx.head_bin.as_deref(), &["--retain-finished", &retain]).await?;
    let start = Instant::now();
    let flat = push(&kept, total, batch, window, every).await;
    let flat_wall = start.elapsed();
    kept.stop().await?;
    let flat = flat?;

    // The slope over the second half, past the allocator's first growth.
    let half = &all[all.len() / 2..];
    let per_task = slope_bytes(half);
    let flat_from = reading_at(&flat, FLAT_FROM.min(total as u64)).context("no reading")?;
    let flat_end = *flat.last().context("no reading")?;
    let growth_mib = (flat_end.1 as f64 - flat_from.1 as f64) / 1024.0;
    let t = crate::report::num(total as f64);
    report.figures.push(Figure::new(
        "retention.rss_per_finished_task",
        format!("head RSS per retained finished task, keeping all {t} (slope)"),
        "bytes",
        per_task,
    ));
    report.figures.push(Figure::new(
        "retention.rss_growth",
        format!(
            "head RSS growth with --retain-finished {RETAIN}, from {} to {t} tasks",
            crate::report::num(flat_from.0 as f64)
        ),
        "MiB",
        growth_mib.max(0.0),
    ));
    report.figures.push(Figure::new(
        "retention.rss_end",
        format!("head RSS after {t} tasks with --retain-finished {RETAIN}"),
        "MiB",
        flat_end.1 as f64 / 1024.0,
    ));
    report.figures.push(Figure::new(
        "retention.rate_keep_all",
        format!("stream rate keeping every task ({t} tasks, RSS readings included)"),
        "tasks/s",
        total as f64 / all_wall.as_secs_f64(),
    ));
    report.figures.push(Figure::new(
        "retention.rate_retained",
        format!("stream rate with --retain-finished {RETAIN} (same run)"),
        "tasks/s",
        total as f64 / flat_wall.as_secs_f64(),
    ));
    let mib = |s: &[Sample]| -> Vec<(f64, f64)> {
        s.iter()
            .map(|(n, kib)| (*n as f64, *kib as f64 / 1024.0))
            .collect()
    };
    report.plots.push(Plot {
        file: "retention-head-rss.png".into(),
        title: "Head memory under a stream of short tasks".into(),
        x_label: "finished tasks".into(),
        y_label: "head RSS (MiB)".into(),
        data: PlotData::Lines {
            lines: vec![
                Line {
                    name: "keep every finished task".into(),
                    points: mib(&all),
                },
                Line {
                    name: format!("--retain-finished {RETAIN}"),
                    points: mib(&flat),
                },
            ],
            x_log: false,
        },
    });
    report.detail = json!({
        "keep_all_rss_kib": all,
        "retention_rss_kib": flat,
        "slope_samples": half.len(),
    });
    report.notes.push(format!(
        "With --retain-finished {RETAIN} the head's RSS went from {:.1} MiB after {} tasks to \
         {:.1} MiB after {t}; keeping every task costs {:.0} MiB more at the measured slope. \
         RSS includes what the allocator keeps after decoding the submit calls.",
        flat_from.1 as f64 / 1024.0,
        crate::report::num(flat_from.0 as f64),
        flat_end.1 as f64 / 1024.0,
        per_task * total as f64 / (1024.0 * 1024.0)
    ));
    Ok(report)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slope_and_readings() {
        let line: Vec<Sample> = (1..=5).map(|i| (i * 1000, 100 + i)).collect();
        assert!((slope_bytes(&line) - 1.024).abs() < 1e-9);
        assert_eq!(slope_bytes(&line[..1]), 0.0);
        assert_eq!(reading_at(&line, 2500), Some((3000, 103)));
        assert_eq!(reading_at(&line, 9000), None);
    }
}
