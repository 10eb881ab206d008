//! `escher top`: the cluster at a glance, refreshed: tasks by namespace and state, the queue
//! and how fast it drains, and each node's use (the `escher nodes` table).
//!
//! Each frame is one `ClusterStatus` call that counts tasks by namespace (one pass over the
//! head's tasks) and one page of running tasks for the per-node counts. On a terminal the
//! screen is redrawn in place; otherwise frames follow one another. `--once` prints one frame
//! and exits.

use std::io::IsTerminal;
use std::process::ExitCode;
use std::time::{Duration, Instant};

use clap::Args;
use escher_proto::types::{TaskCounts, utc_seconds};
use escher_proto::{ClusterStatus, NodeStatus};
use serde::Serialize;

use super::ctx::Ctx;
use super::nodes::{NodeRow, Running, render_nodes, running_per_node};
use super::render::{lines, table};

/// Options of `escher top`.
#[derive(Debug, Clone, Args)]
pub struct TopArgs {
    /// Print one frame and exit
    #[arg(long)]
    pub once: bool,

    /// Refresh this often (`1s`, `500ms`)
    #[arg(long, value_name = "DURATION", default_value = "1s", value_parser = super::values::parse_duration)]
    pub interval: Duration,
}

/// What `escher top --once --json` prints.
#[derive(Debug, Serialize)]
pub struct TopJson<'a> {
    /// The tasks the head keeps, by namespace.
    pub namespaces: &'a [TaskCounts],
    /// How many tasks are pending and running in all.
    pub pending: u64,
    /// How many tasks run.
    pub running: u64,
    /// The live nodes, with the tasks each runs.
    pub nodes: Vec<NodeRow<'a>>,
}

/// The queue's size at one frame, to tell how fast it drains.
#[derive(Debug, Clone, Copy)]
struct Sample {
    at: Instant,
    pending: u64,
}

impl TopArgs {
    pub(crate) async fn run(self, ctx: &mut Ctx<'_>) -> anyhow::Result<ExitCode> {
        let client = ctx.client().await?;
        let terminal = !self.once && !ctx.json && std::io::stdout().is_terminal();
        let mut last: Option<Sample> = None;
        loop {
            let cluster = client.cluster_status_with_task_counts().await?;
            let running = running_per_node(&client).await?;
            let now = Sample {
                at: Instant::now(),
                pending: cluster.pending_tasks,
            };
            if ctx.json {
                let nodes = cluster
                    .nodes
                    .iter()
                    .filter(|n| n.alive)
                    .map(|n| NodeRow::new(n, running.as_ref()))
                    .collect();
                ctx.emit_json(&TopJson {
                    namespaces: &cluster.namespaces,
                    pending: cluster.pending_tasks,
                    running: cluster.running_tasks,
                    nodes,
                })?;
            } else {
                let frame = render_top(&cluster, running.as_ref(), last, now);
                if terminal {
                    // Home, then clear: the frame is redrawn in place.
                    ctx.emit(&format!("\x1b[H\x1b[2J{frame}"))?;
                } else {
                    ctx.emit(&frame)?;
                }
            }
            if self.once {
                return Ok(ExitCode::SUCCESS);
            }
            last = Some(now);
            tokio::time::sleep(self.interval).await;
            if !terminal {
                ctx.emit("\n")?;
            }
        }
    }
}

/// One frame of `escher top`: `last` is the previous frame's queue, for the drain rate.
fn render_top(
    cluster: &ClusterStatus,
    running: Option<&Running>,
    last: Option<Sample>,
    now: Sample,
) -> String {
    let live: Vec<&NodeStatus> = cluster.nodes.iter().filter(|n| n.alive).collect();
    let left = cluster.nodes.len() - live.len();
    let mut out = format!(
        "escher top · {} · {} node{} live{} · {} running · {} pending\n",
        utc_seconds(now_ms()),
        live.len(),
        if live.len() == 1 { "" } else { "s" },
        if left > 0 {
            format!(", {left} left")
        } else {
            String::new()
        },
        cluster.running_tasks,
        cluster.pending_tasks,
    );
    out.push_str(&queue_line(last, now));
    out.push('\n');
    if cluster.namespaces.is_empty() {
        out.push_str("no tasks\n");
    } else {
        let mut t = table(&[
            "NAMESPACE",
            "PENDING",
            "RUNNING",
            "SUCCEEDED",
            "FAILED",
            "CANCELLED",
        ]);
        for c in &cluster.namespaces {
            t.add_row(vec![
                c.namespace.as_ref().map_or("-".into(), ToString::to_string),
                c.pending.to_string(),
                c.running.to_string(),
                c.succeeded.to_string(),
                c.failed.to_string(),
                c.cancelled.to_string(),
            ]);
        }
        out.push_str(&lines(&t));
    }
    out.push('\n');
    out.push_str(&render_nodes(cluster, &live, running));
    out
}

/// How the queue moves between two frames.
fn queue_line(last: Option<Sample>, now: Sample) -> String {
    let Some(last) = last else {
        return format!("queue: {} pending\n", now.pending);
    };
    let seconds = now.at.duration_since(last.at).as_secs_f64();
    if seconds <= 0.0 {
        return format!("queue: {} pending\n", now.pending);
    }
    let rate = (last.pending as f64 - now.pending as f64) / seconds;
    match (now.pending, rate) {
        (0, _) => "queue: empty\n".to_string(),
        (n, r) if r > 0.0 => format!(
            "queue: {n} pending, draining {r:.1}/s (about {:.0} s left)\n",
            n as f64 / r
        ),
        (n, r) if r < 0.0 => format!("queue: {n} pending, growing {:.1}/s\n", -r),
        (n, _) => format!("queue: {n} pending, not moving\n"),
    }
}

fn now_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample(at: Instant, pending: u64) -> Sample {
        Sample { at, pending }
    }

    #[test]
    fn the_queue_line_says_how_it_moves() {
        let t0 = Instant::now();
        let t1 = t0 + Duration::from_secs(2);
        assert_eq!(queue_line(None, sample(t0, 5)), "queue: 5 pending\n");
        assert_eq!(
            queue_line(Some(sample(t0, 10)), sample(t1, 6)),
            "queue: 6 pending, draining 2.0/s (about 3 s left)\n"
        );
        assert_eq!(
            queue_line(Some(sample(t0, 6)), sample(t1, 10)),
            "queue: 10 pending, growing 2.0/s\n"
        );
        assert_eq!(
            queue_line(Some(sample(t0, 3)), sample(t1, 0)),
            "queue: empty\n"
        );
        assert_eq!(
            queue_line(Some(sample(t0, 3)), sample(t1, 3)),
            "queue: 3 pending, not moving\n"
        );
    }
}
