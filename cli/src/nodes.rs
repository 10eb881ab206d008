//! `escher nodes`: one row per node, for clusters where `status` (a row per resource, and with
//! MIG slices dozens per node) is too long to read: liveness, labels, CPU, memory and GPU use,
//! how many other resources the node holds, and how many tasks run there.
//!
//! Running tasks are counted from one `ListTasks` page of running tasks (up to 10,000); past
//! that, counts are lower bounds and the table says so.

use std::collections::BTreeMap;
use std::process::ExitCode;

use clap::Args;
use escher_proto::types::{
    ISOLATION_LABEL, LIMITS_MISSING_LABEL, ListTasksRequest, is_gpu_resource, under_disk_reserve,
};
use escher_proto::{
    Amount, Capacity, ClusterStatus, NodeId, NodeStatus, ResourceStatus, TaskState,
};
use serde::Serialize;

use super::ctx::Ctx;
use super::render::{lines, table};

/// How many running tasks one `nodes` call reads to count them per node.
const RUNNING_PAGE: u32 = 10_000;

/// Options of `escher nodes`.
#[derive(Debug, Clone, Args)]
pub struct NodesArgs {
    /// Show nodes that have left too
    #[arg(long)]
    pub all: bool,
}

/// One row of `escher nodes --json`.
#[derive(Debug, Serialize)]
pub struct NodeRow<'a> {
    /// The node as the head reports it.
    pub node: &'a NodeStatus,
    /// Tasks running there (a lower bound when `running_exact` is false); absent for a
    /// caller that sees no tasks.
    pub running: Option<u64>,
    /// Whether `running` counts every running task.
    pub running_exact: bool,
}

impl<'a> NodeRow<'a> {
    /// The row of `node`, with its count from `running`.
    pub(crate) fn new(node: &'a NodeStatus, running: Option<&Running>) -> NodeRow<'a> {
        NodeRow {
            node,
            running: running.map(|(counts, _)| counts.get(&node.id).copied().unwrap_or(0)),
            running_exact: running.is_some_and(|(_, exact)| *exact),
        }
    }
}

impl NodesArgs {
    pub(crate) async fn run(self, ctx: &mut Ctx<'_>) -> anyhow::Result<ExitCode> {
        let client = ctx.client().await?;
        let cluster = client.cluster_status().await?;
        let running = running_per_node(&client).await?;
        let shown: Vec<&NodeStatus> = cluster
            .nodes
            .iter()
            .filter(|n| self.all || n.alive)
            .collect();
        if ctx.json {
            let rows: Vec<NodeRow<'_>> = shown
                .iter()
                .map(|n| NodeRow::new(n, running.as_ref()))
                .collect();
            ctx.emit_json(&rows)?;
        } else {
            ctx.emit(&render_nodes(&cluster, &shown, running.as_ref()))?;
        }
        Ok(ExitCode::SUCCESS)
    }
}

/// How many tasks run on each node, and whether that counts all of them (one page of running
/// tasks is read).
pub(crate) type Running = (BTreeMap<NodeId, u64>, bool);

/// How many tasks run on each node ([`Running`]); `None` for a caller that sees no tasks (a
/// reader token).
pub(crate) async fn running_per_node(
    client: &escher_client::Client,
) -> Result<Option<Running>, escher_client::ClientError> {
    let page = client
        .list_tasks_page(ListTasksRequest {
            state: Some(TaskState::Running),
            limit: RUNNING_PAGE,
            ..ListTasksRequest::default()
        })
        .await;
    let page = match page {
        Err(escher_client::ClientError::PermissionDenied(_)) => return Ok(None),
        other => other?,
    };
    let mut running: BTreeMap<NodeId, u64> = BTreeMap::new();
    for task in &page.tasks {
        if let Some(node) = task.node {
            *running.entry(node).or_default() += 1;
        }
    }
    Ok(Some((running, page.more == 0)))
}

/// What a caller that sees no tasks is told instead of their counts.
pub(crate) const NO_TASKS: &str = "a reader token sees no tasks: running counts are not shown\n";

/// The text of `escher nodes`.
pub fn render_nodes(
    cluster: &ClusterStatus,
    shown: &[&NodeStatus],
    running: Option<&Running>,
) -> String {
    let left = cluster.nodes.iter().filter(|n| !n.alive).count();
    if shown.is_empty() {
        return if left > 0 {
            format!("no live nodes ({left} left; --all shows them)\n")
        } else {
            "no nodes have registered yet\n".to_string()
        };
    }
    let mut t = table(&[
        "NODE", "NAME", "ALIVE", "CPU", "MEMORY", "GPU", "OTHER", "RUNNING", "LABELS",
    ]);
    for n in shown {
        let count = match running {
            Some((counts, true)) => counts.get(&n.id).copied().unwrap_or(0).to_string(),
            Some((counts, false)) => format!("{}+", counts.get(&n.id).copied().unwrap_or(0)),
            None => "-".to_string(),
        };
        t.add_row(vec![
            n.id.to_string(),
            n.name.clone(),
            match (n.alive, n.waiting_for_stream, under_disk_reserve(&n.labels)) {
                (true, false, false) => "yes",
                (true, true, _) => "attaching",
                (true, false, true) => "disk-full",
                (false, _, _) => "no",
            }
            .to_string(),
            use_of(n.resource("cpu")),
            use_of(n.resource("memory")) + mib(n.resource("memory")),
            gpus(n),
            others(n),
            count,
            n.labels.to_string(),
        ]);
    }
    let mut out = lines(&t);
    out.push_str(&isolation_warning(shown.iter().copied()));
    out.push_str(&limits_warning(shown.iter().copied()));
    out.push_str(&fence_warning(shown.iter().copied()));
    if left > 0 && shown.len() < cluster.nodes.len() {
        out.push_str(&format!(
            "{left} node(s) left the cluster; --all shows them\n"
        ));
    }
    if running.is_none() {
        out.push_str(NO_TASKS);
    }
    if let Some((_, false)) = running {
        out.push_str(&format!(
            "running counts come from the first {RUNNING_PAGE} running tasks: they are lower bounds\n"
        ));
    }
    out
}

/// A line naming the live nodes whose tasks share their worker's user (their worker says so in
/// its [`ISOLATION_LABEL`]), or nothing when there are none.
pub fn isolation_warning<'a>(nodes: impl IntoIterator<Item = &'a NodeStatus>) -> String {
    let shared: Vec<&str> = nodes
        .into_iter()
        .filter(|n| n.alive && n.labels.get(ISOLATION_LABEL) == Some("none"))
        .map(|n| n.name.as_str())
        .collect();
    if shared.is_empty() {
        return String::new();
    }
    format!(
        "tasks on {} share one user: tenants there are not isolated (run escher-worker as root \
         for a user per namespace; --require-isolation refuses to start otherwise)\n",
        shared.join(", ")
    )
}

/// A line naming the live nodes that cannot hold their command tasks to every limit they ask
/// for, with the limits each lacks (its worker names them in its [`LIMITS_MISSING_LABEL`]),
/// or nothing when there are none.
pub fn limits_warning<'a>(nodes: impl IntoIterator<Item = &'a NodeStatus>) -> String {
    let lacking: Vec<String> = nodes
        .into_iter()
        .filter(|n| n.alive)
        .filter_map(|n| {
            Some(format!(
                "{} ({})",
                n.name,
                n.labels.get(LIMITS_MISSING_LABEL)?
            ))
        })
        .collect();
    if lacking.is_empty() {
        return String::new();
    }
    format!(
        "tasks on {} are not held to these limits: a task there can use more than it asked for \
         (escher-worker --require-limits refuses to start otherwise; its log says why)\n",
        lacking.join(", ")
    )
}

/// A line per live node whose worker reports trouble with its fence supervisor
/// ([`NodeStatus::fence`]: restarted, down, or none), or nothing when there are none.
pub fn fence_warning<'a>(nodes: impl IntoIterator<Item = &'a NodeStatus>) -> String {
    let mut out = String::new();
    for n in nodes.into_iter().filter(|n| n.alive) {
        let Some(report) = &n.fence else {
            continue;
        };
        let what = if report.starts_with("restarted") {
            "its fence supervisor died and another took over its tasks"
        } else {
            "its tasks are NOT fenced"
        };
        out.push_str(&format!("fence of {}: {what} ({report})\n", n.name));
    }
    out
}

/// `used / total`, or `-` when the node has none.
fn use_of(r: Option<&ResourceStatus>) -> String {
    r.map_or_else(|| "-".to_string(), |r| format!("{} / {}", r.used, r.total))
}

/// The unit after a memory figure.
fn mib(r: Option<&ResourceStatus>) -> &'static str {
    if r.is_some() { " MiB" } else { "" }
}

/// Whole GPUs used / total, and MIG slices in use / in all (summed over the `mig.<profile>`
/// class resources).
fn gpus(n: &NodeStatus) -> String {
    let whole = use_of(n.resource("gpu"));
    let classes = n.resources.iter().filter(|r| is_mig_class(r.name.as_str()));
    let (mut used, mut total) = (Amount::ZERO, Amount::ZERO);
    let mut any = false;
    for r in classes {
        any = true;
        used = used.checked_add(r.used).unwrap_or(Amount::MAX);
        if let Capacity::Finite(t) = r.total {
            total = total.checked_add(t).unwrap_or(Amount::MAX);
        }
    }
    if any {
        format!("{whole}, MIG {used} / {total}")
    } else {
        whole
    }
}

/// `mig.<profile>` (`mig.3g.20gb`), not `mig.<uuid>`.
fn is_mig_class(name: &str) -> bool {
    let Some(rest) = name.strip_prefix("mig.") else {
        return false;
    };
    let mut chars = rest.chars();
    chars.next().is_some_and(|c| c.is_ascii_digit()) && rest.contains("g.")
}

/// How many resources besides cpu, memory and GPU devices the node holds.
fn others(n: &NodeStatus) -> String {
    let count = n
        .resources
        .iter()
        .filter(|r| {
            let name = r.name.as_str();
            name != "cpu" && name != "memory" && !is_gpu_resource(name)
        })
        .count();
    count.to_string()
}

#[cfg(test)]
mod tests {
    use escher_proto::types::Labels;

    use super::*;

    fn res(name: &str, total: &str, used: &str) -> ResourceStatus {
        ResourceStatus {
            name: name.parse().unwrap(),
            total: total.parse().unwrap(),
            used: used.parse().unwrap(),
        }
    }

    fn node(id: u64, alive: bool, resources: Vec<ResourceStatus>) -> NodeStatus {
        NodeStatus {
            id: NodeId(id),
            name: format!("w{id}"),
            address: "127.0.0.1:0".into(),
            alive,
            labels: Labels::new(),
            resources,
            left_at_ms: None,
            left_because: None,
            fence: None,
            waiting_for_stream: false,
        }
    }

    #[test]
    fn nodes_whose_tasks_share_a_user_are_named() {
        let mut shared = node(1, true, vec![]);
        shared.labels.insert(ISOLATION_LABEL, "none").unwrap();
        let mut isolated = node(2, true, vec![]);
        isolated.labels.insert(ISOLATION_LABEL, "uid").unwrap();
        let mut gone = node(3, false, vec![]);
        gone.labels.insert(ISOLATION_LABEL, "none").unwrap();
        let text = isolation_warning([&shared, &isolated, &gone]);
        assert!(
            text.starts_with("tasks on w1 share one user: tenants there are not isolated"),
            "{text}"
        );
        assert_eq!(isolation_warning([&isolated, &node(4, true, vec![])]), "");
    }

    #[test]
    fn nodes_that_do_not_hold_every_limit_are_named() {
        let mut lacking = node(1, true, vec![]);
        lacking
            .labels
            .insert(LIMITS_MISSING_LABEL, "cpu+memory")
            .unwrap();
        let mut gone = node(2, false, vec![]);
        gone.labels.insert(LIMITS_MISSING_LABEL, "pids").unwrap();
        let text = limits_warning([&lacking, &gone, &node(3, true, vec![])]);
        assert!(
            text.starts_with("tasks on w1 (cpu+memory) are not held to these limits"),
            "{text}"
        );
        assert_eq!(limits_warning([&node(4, true, vec![])]), "");
    }

    #[test]
    fn a_node_under_its_disk_reserve_shows_disk_full() {
        let mut full = node(1, true, vec![]);
        full.labels
            .insert(escher_proto::types::DISK_UNDER_RESERVE_LABEL, "true")
            .unwrap();
        let cluster = ClusterStatus {
            nodes: vec![full, node(2, true, vec![])],
            pending_tasks: 0,
            running_tasks: 0,
            namespaces: Vec::new(),
            pending_actor_calls: None,
        };
        let live: Vec<&NodeStatus> = cluster.nodes.iter().collect();
        let text = render_nodes(&cluster, &live, Some(&(BTreeMap::new(), true)));
        let rows: Vec<&str> = text.lines().skip(1).take(2).collect();
        assert!(rows[0].contains("disk-full"), "{text}");
        assert!(
            !rows[1].contains("disk-full") && rows[1].contains("yes"),
            "{text}"
        );
        assert!(!cluster.nodes[0].takes_tasks() && cluster.nodes[1].takes_tasks());
    }

    #[test]
    fn nodes_whose_fence_died_are_named() {
        let mut restarted = node(1, true, vec![]);
        restarted.fence = Some("restarted 1 time(s): the last supervisor was killed".into());
        let mut down = node(2, true, vec![]);
        down.fence = Some("down: the fence supervisor exited".into());
        let text = fence_warning([&restarted, &down, &node(3, true, vec![])]);
        assert_eq!(
            text,
            "fence of w1: its fence supervisor died and another took over its tasks (restarted 1 \
             time(s): the last supervisor was killed)\nfence of w2: its tasks are NOT fenced \
             (down: the fence supervisor exited)\n"
        );
        assert_eq!(fence_warning([&node(4, true, vec![])]), "");
    }

    #[test]
    fn one_row_per_node_with_use_slices_and_counts() {
        let cluster = ClusterStatus {
            nodes: vec![
                node(
                    1,
                    true,
                    vec![
                        res("cpu", "8", "2"),
                        res("memory", "1024", "0"),
                        res("gpu", "1", "0"),
                        res("mig.3g.20gb", "1", "1"),
                        res("mig.1g.5gb", "2", "0"),
                        res("mig.MIG-abc", "1", "1"),
                        res("dataset-7", "unbounded", "0"),
                    ],
                ),
                node(2, false, vec![]),
            ],
            pending_tasks: 0,
            running_tasks: 3,
            namespaces: Vec::new(),
            pending_actor_calls: None,
        };
        let live: Vec<&NodeStatus> = cluster.nodes.iter().filter(|n| n.alive).collect();
        let running: BTreeMap<NodeId, u64> = [(NodeId(1), 3)].into_iter().collect();
        let text = render_nodes(&cluster, &live, Some(&(running.clone(), true)));
        let row = text.lines().nth(1).unwrap();
        for want in ["w1", "2 / 8", "0 / 1024 MiB", "MIG 1 / 3", " 1 ", " 3 "] {
            assert!(row.contains(want), "{want:?} missing from {row:?}");
        }
        assert!(
            text.contains("1 node(s) left the cluster; --all shows them"),
            "{text}"
        );
        // Counts from a partial page are lower bounds, and say so.
        let text = render_nodes(&cluster, &live, Some(&(running.clone(), false)));
        assert!(
            text.contains("3+") && text.contains("lower bounds"),
            "{text}"
        );
        assert_eq!(
            render_nodes(&cluster, &[], Some(&(running.clone(), true))),
            "no live nodes (1 left; --all shows them)\n"
        );
    }
}
