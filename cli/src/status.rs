//! `escher status`: the nodes, every resource on each (total, used, available), the pending
//! tasks with the reason each cannot be placed, how many actors live, and the head group's
//! replicas.
//!
//! A resource whose use exceeds its total (its capacity shrank below what running tasks hold,
//! docs/DESIGN.md §3) is marked in the `NOTE` column with how far over it is; unbounded capacities
//! show `unbounded`. Pending tasks come from one `ListTasks` call (state pending), whose
//! summaries already carry the head's reason; live actors from another (the tasks labelled
//! `escher.actor`), counted by state (`escher actors` lists them).

use std::process::ExitCode;

use clap::Args;
use escher_proto::types::{ACTOR_LABEL, HeadsReply, ListTasksRequest, PolicyReport, utc_seconds};
use escher_proto::{ClusterStatus, NodeStatus, TaskState, TaskSummary};
use serde::Serialize;

use super::ctx::Ctx;
use super::render::{lines, table};

/// Options of `escher status`.
#[derive(Debug, Clone, Args)]
pub struct StatusArgs {
    /// List at most N pending tasks (0: none)
    #[arg(long, value_name = "N", default_value_t = 20)]
    pub pending: usize,

    /// Show this node only (its resources, and the tasks pending anywhere)
    #[arg(long, value_name = "N")]
    pub node: Option<u64>,
}

/// What `escher status --json` prints.
#[derive(Debug, Serialize)]
pub struct StatusJson<'a> {
    /// The cluster status as the head reports it.
    pub cluster: &'a ClusterStatus,
    /// The first pending tasks, with their reasons.
    pub pending: &'a [TaskSummary],
    /// The live actors (pending or running), when the caller sees tasks.
    pub actors: &'a [TaskSummary],
    /// The head group's replicas, when the head reports them.
    pub heads: Option<&'a HeadsReply>,
    /// The policies' latest reports (where each tenant of an ESL stands).
    pub policies: &'a [PolicyReport],
}

/// How many live actors one status counts at most.
const ACTORS_COUNTED: u32 = 10_000;

impl StatusArgs {
    pub(crate) async fn run(self, ctx: &mut Ctx<'_>) -> anyhow::Result<ExitCode> {
        let client = ctx.client().await?;
        let mut cluster = client.cluster_status().await?;
        if let Some(node) = self.node {
            cluster.nodes.retain(|n| n.id.0 == node);
            if cluster.nodes.is_empty() {
                anyhow::bail!("the head knows no node {node}; `escher nodes --all` lists them");
            }
        }
        // A reader sees the cluster, not its tasks: no pending list, and the status says so.
        let mut sees_tasks = true;
        let pending = if self.pending == 0 || cluster.pending_tasks == 0 {
            Vec::new()
        } else {
            match client
                .list_tasks(Some(TaskState::Pending), Some(self.pending))
                .await
            {
                Err(escher_client::ClientError::PermissionDenied(_)) => {
                    sees_tasks = false;
                    Vec::new()
                }
                other => other?,
            }
        };
        let actors = if sees_tasks && cluster.running_tasks + cluster.pending_tasks > 0 {
            let query = ListTasksRequest {
                labels: vec![(ACTOR_LABEL.to_string(), None)],
                limit: ACTORS_COUNTED,
                ..ListTasksRequest::default()
            };
            match client.list_tasks_page(query).await {
                Err(escher_client::ClientError::PermissionDenied(_)) => {
                    sees_tasks = false;
                    Vec::new()
                }
                other => other?.tasks,
            }
        } else {
            Vec::new()
        };
        let actors: Vec<TaskSummary> = actors
            .into_iter()
            .filter(|t| !t.state.is_terminal())
            .collect();
        // A head that predates replication has no replicas to show: leave the section out.
        let heads = client.heads().await.ok();
        // A head that predates policy reports has none to show.
        let policies = client.policies().await.unwrap_or_default();
        if ctx.json {
            ctx.emit_json(&StatusJson {
                cluster: &cluster,
                pending: &pending,
                actors: &actors,
                heads: heads.as_ref(),
                policies: &policies,
            })?;
        } else {
            let mut text = render_status(&cluster, &pending);
            text.push_str(&render_actors_line(&actors, cluster.pending_actor_calls));
            if !sees_tasks {
                text.push_str("a reader token sees no tasks: the pending ones are not listed\n");
            }
            for report in &policies {
                text.push('\n');
                text.push_str(&render_policy(report, now_ms()));
            }
            if let Some(heads) = &heads {
                text.push('\n');
                text.push_str(&super::heads::render_heads(heads));
            }
            ctx.emit(&text)?;
        }
        Ok(ExitCode::SUCCESS)
    }
}

/// One policy's latest report: a line naming it, then a row per tenant with its measures as
/// columns (in name order).
pub fn render_policy(report: &PolicyReport, now_ms: u64) -> String {
    let age = now_ms.saturating_sub(report.reported_at_ms) / 1000;
    let scope = report
        .namespace
        .as_deref()
        .map_or_else(String::new, |ns| format!(" in namespace {ns}"));
    let mut text = format!("policy {}{scope}, reported {age}s ago:\n", report.policy);
    let measures: std::collections::BTreeSet<&str> = report
        .rows
        .iter()
        .flat_map(|r| r.measures.keys().map(String::as_str))
        .collect();
    let mut header = vec!["ROW".to_string()];
    header.extend(measures.iter().map(|m| m.to_uppercase()));
    let header: Vec<&str> = header.iter().map(String::as_str).collect();
    let mut t = table(&header);
    for row in &report.rows {
        let mut cells = vec![row.row.clone()];
        cells.extend(measures.iter().map(|m| {
            row.measures
                .get(*m)
                .map_or_else(|| "-".to_string(), |v| number(*v))
        }));
        t.add_row(cells);
    }
    text.push_str(&lines(&t));
    text
}

fn now_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
}

/// A measure as people read it: whole numbers plain, others to three significant places.
fn number(v: f64) -> String {
    if v.fract() == 0.0 && v.abs() < 1e15 {
        format!("{v:.0}")
    } else if v.abs() >= 100.0 {
        format!("{v:.1}")
    } else {
        format!("{v:.3}")
    }
}

/// The text of `escher status`.
pub fn render_status(cluster: &ClusterStatus, pending: &[TaskSummary]) -> String {
    let alive = cluster.nodes.iter().filter(|n| n.alive).count();
    let mut out = format!(
        "{} nodes ({alive} alive), {} running, {} pending\n",
        cluster.nodes.len(),
        cluster.running_tasks,
        cluster.pending_tasks
    );
    if cluster.nodes.is_empty() {
        out.push_str("\nno nodes have registered yet\n");
    } else {
        out.push('\n');
        out.push_str(&render_nodes(cluster));
        out.push_str(&crate::nodes::isolation_warning(&cluster.nodes));
        out.push_str(&crate::nodes::limits_warning(&cluster.nodes));
        out.push('\n');
        out.push_str(&render_resources(cluster));
    }
    out.push('\n');
    out.push_str(&render_pending(pending, cluster.pending_tasks));
    out
}

/// One line counting the live actors by state, and the calls waiting at them (`calls`, the
/// head's total from the workers' heartbeats; left out when the head has none to give): empty
/// when there are none.
pub fn render_actors_line(actors: &[TaskSummary], calls: Option<u64>) -> String {
    if actors.is_empty() {
        return String::new();
    }
    let running = actors
        .iter()
        .filter(|t| t.state == TaskState::Running)
        .count();
    let n = actors.len();
    let noun = if n == 1 { "actor" } else { "actors" };
    let calls = match calls {
        Some(1) => ", 1 call waiting".to_string(),
        Some(c) => format!(", {c} calls waiting"),
        None => String::new(),
    };
    format!(
        "{n} {noun}: {running} running, {} pending or restarting{calls} (escher actors lists \
         them)\n",
        n - running
    )
}

fn render_nodes(cluster: &ClusterStatus) -> String {
    let mut t = table(&["NODE", "NAME", "ADDRESS", "ALIVE", "LABELS"]);
    for n in &cluster.nodes {
        t.add_row(vec![
            n.id.to_string(),
            n.name.clone(),
            n.address.clone(),
            alive(n),
            n.labels.to_string(),
        ]);
    }
    lines(&t)
}

/// `yes`; `yes, attaching` while its worker's stream is not attached (it takes no task yet);
/// `yes, disk under reserve` while its disk is (it takes no new task); or when and why the
/// node left: `no: left 2026-11-23T10:00:00Z (no heartbeat for 10s)`.
fn alive(n: &NodeStatus) -> String {
    if n.alive {
        return if n.waiting_for_stream {
            "yes, attaching"
        } else if escher_proto::types::under_disk_reserve(&n.labels) {
            "yes, disk under reserve"
        } else {
            "yes"
        }
        .to_string();
    }
    let mut text = "no".to_string();
    if let Some(at) = n.left_at_ms {
        text.push_str(&format!(": left {}", utc_seconds(at)));
    }
    if let Some(why) = &n.left_because {
        text.push_str(&format!(" ({why})"));
    }
    text
}

fn render_resources(cluster: &ClusterStatus) -> String {
    let mut t = table(&["NODE", "RESOURCE", "TOTAL", "USED", "AVAILABLE", "NOTE"]);
    let mut short = false;
    for n in &cluster.nodes {
        for r in &n.resources {
            let shortfall = r.shortfall();
            let note = if !shortfall.is_zero() {
                short = true;
                format!("SHORTFALL: {shortfall} over total")
            } else if !n.alive {
                "node down".to_string()
            } else {
                String::new()
            };
            let available = r
                .available()
                .map_or_else(|| "unbounded".to_string(), |a| a.to_string());
            let used = if shortfall.is_zero() {
                r.used.to_string()
            } else {
                format!("{} (!)", r.used)
            };
            t.add_row(vec![
                n.id.to_string(),
                r.name.to_string(),
                r.total.to_string(),
                used,
                available,
                note,
            ]);
        }
    }
    if t.row_count() == 0 {
        return "no resources\n".to_string();
    }
    let mut out = lines(&t);
    if short {
        out.push_str(
            "(!) used exceeds total: the capacity shrank below what running tasks hold; \
             nothing new is admitted until use falls under it\n",
        );
    }
    out
}

fn render_pending(pending: &[TaskSummary], total: u64) -> String {
    if pending.is_empty() {
        return if total == 0 {
            "no pending tasks\n".to_string()
        } else {
            format!("{total} pending tasks (not listed)\n")
        };
    }
    let mut t = table(&["PENDING", "NAME", "RESOURCES", "REASON"]);
    for task in pending {
        t.add_row(vec![
            task.id.to_string(),
            task.name.clone(),
            task.resources.to_string(),
            task.reason
                .clone()
                .unwrap_or_else(|| "waiting for resources to free up".to_string()),
        ]);
    }
    let mut out = lines(&t);
    let shown = pending.len() as u64;
    if total > shown {
        out.push_str(&format!(
            "... and {} more (escher tasks --state pending)\n",
            total - shown
        ));
    }
    out
}

#[cfg(test)]
mod tests {
    use escher_proto::{Labels, NodeId, NodeStatus, ResourceStatus, TaskId};

    use super::*;

    fn res(name: &str, total: &str, used: &str) -> ResourceStatus {
        ResourceStatus {
            name: name.parse().unwrap(),
            total: total.parse().unwrap(),
            used: used.parse().unwrap(),
        }
    }

    fn cluster() -> ClusterStatus {
        ClusterStatus {
            nodes: vec![
                NodeStatus {
                    id: NodeId(1),
                    name: "w1".into(),
                    address: "10.0.0.1:7601".into(),
                    alive: true,
                    labels: "zone=a".parse().unwrap(),
                    resources: vec![
                        res("cpu", "4", "1.5"),
                        res("app/loc", "unbounded", "7"),
                        res("app/x", "1", "3"),
                    ],
                    left_at_ms: None,
                    left_because: None,
                    fence: None,
                    waiting_for_stream: false,
                },
                NodeStatus {
                    id: NodeId(2),
                    name: "w2".into(),
                    address: "10.0.0.2:7601".into(),
                    alive: false,
                    labels: Labels::new(),
                    resources: vec![res("cpu", "2", "0")],
                    left_at_ms: Some(1_700_000_000_000),
                    left_because: Some("no heartbeat for 10s".into()),
                    fence: None,
                    waiting_for_stream: false,
                },
            ],
            pending_tasks: 3,
            running_tasks: 1,
            namespaces: Vec::new(),
            pending_actor_calls: None,
        }
    }

    fn pending() -> Vec<TaskSummary> {
        vec![TaskSummary {
            id: TaskId(7),
            name: "train".into(),
            state: TaskState::Pending,
            node: None,
            attempt: 0,
            reason: Some("no live node has 8 gpu (the most is 4)".into()),
            resources: "gpu=8".parse().unwrap(),
            submitted_at_ms: 1_700_000_000_000,
            started_at_ms: None,
            finished_at_ms: None,
            namespace: None,
        }]
    }

    #[test]
    fn live_actors_are_counted_by_state_in_one_line() {
        assert_eq!(render_actors_line(&[], Some(3)), "");
        assert!(
            render_actors_line(&[pending().remove(0)], None).starts_with("1 actor: 0 running, 1 ")
        );
        let actor = |id, state, attempt| TaskSummary {
            id: TaskId(id),
            state,
            attempt,
            ..pending().remove(0)
        };
        let actors = [
            actor(1, TaskState::Running, 1),
            actor(2, TaskState::Running, 3),
            actor(3, TaskState::Pending, 1),
        ];
        assert_eq!(
            render_actors_line(&actors, None),
            "3 actors: 2 running, 1 pending or restarting (escher actors lists them)\n"
        );
        // With the head's total of the calls waiting at them.
        assert_eq!(
            render_actors_line(&actors, Some(12)),
            "3 actors: 2 running, 1 pending or restarting, 12 calls waiting (escher actors \
             lists them)\n"
        );
        assert!(render_actors_line(&actors, Some(1)).contains(", 1 call waiting ("));
    }

    /// The line whose first words are `first`.
    fn row<'a>(text: &'a str, first: &str) -> &'a str {
        let want: Vec<&str> = first.split_whitespace().collect();
        text.lines()
            .find(|l| {
                l.split_whitespace()
                    .take(want.len())
                    .eq(want.iter().copied())
            })
            .unwrap_or_else(|| panic!("no line starting {first:?} in\n{text}"))
    }

    #[test]
    fn table_shows_totals_shortfalls_and_reasons() {
        let text = render_status(&cluster(), &pending());
        assert!(
            text.starts_with("2 nodes (1 alive), 1 running, 3 pending\n"),
            "{text}"
        );
        let node1 = row(&text, "1 w1");
        assert!(
            node1.contains("10.0.0.1:7601") && node1.contains("yes"),
            "{node1}"
        );
        assert!(node1.contains("zone=a"), "{node1}");
        let node2 = row(&text, "2 w2");
        assert!(
            node2.contains("no: left 2023-11-14T22:13:20Z (no heartbeat for 10s)"),
            "{node2}"
        );

        let cpu = row(&text, "1 cpu");
        let cols: Vec<&str> = cpu.split_whitespace().collect();
        assert_eq!(cols, ["1", "cpu", "4", "1.5", "2.5"], "{cpu}");
        let loc = row(&text, "1 app/loc");
        let cols: Vec<&str> = loc.split_whitespace().collect();
        assert_eq!(
            cols,
            ["1", "app/loc", "unbounded", "7", "unbounded"],
            "{loc}"
        );
        let x = row(&text, "1 app/x");
        assert!(
            x.contains("3 (!)") && x.contains("SHORTFALL: 2 over total"),
            "{x}"
        );
        assert!(row(&text, "2 cpu").contains("node down"));
        assert!(text.contains("(!) used exceeds total"), "{text}");

        let p = row(&text, "7");
        assert!(p.contains("train") && p.contains("gpu=8"), "{p}");
        assert!(p.contains("no live node has 8 gpu"), "{p}");
        assert!(text.contains("... and 2 more"), "{text}");
    }

    #[test]
    fn quiet_cluster() {
        let text = render_status(&ClusterStatus::default(), &[]);
        assert!(text.contains("no nodes have registered yet"), "{text}");
        assert!(text.contains("no pending tasks"), "{text}");
        assert!(!text.contains("(!)"));
    }

    #[test]
    fn a_policy_report_is_a_table_of_its_rows_and_measures() {
        let report = PolicyReport {
            policy: "fair-time".into(),
            namespace: Some("ops".into()),
            reported_at_ms: 10_000,
            rows: vec![
                escher_proto::types::PolicyRow {
                    row: "heavy".into(),
                    measures: [("factor".into(), 0.125), ("usage".into(), 3600.0)].into(),
                },
                escher_proto::types::PolicyRow {
                    row: "light".into(),
                    measures: [("factor".into(), 1.0)].into(),
                },
            ],
        };
        let text = render_policy(&report, 12_500);
        assert!(
            text.starts_with("policy fair-time in namespace ops, reported 2s ago:"),
            "{text}"
        );
        assert!(text.contains("ROW    FACTOR  USAGE"), "{text}");
        assert!(text.contains("heavy  0.125   3600"), "{text}");
        assert!(text.contains("light  1       -"), "{text}");
    }

    #[test]
    fn json_is_the_domain_types() {
        let c = cluster();
        let p = pending();
        let value = serde_json::to_value(StatusJson {
            cluster: &c,
            pending: &p,
            actors: &p,
            heads: None,
            policies: &[],
        })
        .unwrap();
        assert_eq!(value["cluster"]["nodes"][0]["name"], "w1");
        assert_eq!(
            value["cluster"]["nodes"][0]["resources"][1]["total"],
            "unbounded"
        );
        assert_eq!(
            value["cluster"]["nodes"][0]["resources"][0]["total"], "4",
            "amounts are the decimal text the tables show"
        );
        assert_eq!(value["pending"][0]["id"], 7);
        assert_eq!(value["cluster"]["pending_tasks"], 3);
    }
}
