//! [`FenceReports`]: what each worker's latest heartbeat said about its fence supervisor
//! (`Heartbeat.fence`, DESIGN §13), kept by the leader and shown with the node in status
//! replies (`NodeStatus.fence`; `escher nodes` names such nodes).
//!
//! Soft state, like everything the leader hears from workers: a worker repeats its report in
//! every heartbeat, so a new leader knows it within a heartbeat of the worker attaching; a
//! replica that does not lead has none to show (a report it heard while it led is shown only
//! while it is [`FRESH`]). Nothing here is replicated or written to the log.

use std::sync::Mutex;
use std::time::{Duration, Instant};

use escher_proto::types::{ClusterStatus, NodeId};
use rustc_hash::FxHashMap;

/// How long a report is shown without being repeated (a worker repeats it every heartbeat).
pub(crate) const FRESH: Duration = Duration::from_secs(30);

/// What each worker last said about its fence, and when.
#[derive(Debug, Default)]
pub(crate) struct FenceReports(Mutex<FxHashMap<NodeId, (String, Instant)>>);

impl FenceReports {
    /// Worker `node` sent a heartbeat with this report (`None`: its fence is as it started).
    pub(crate) fn reported(&self, node: NodeId, report: Option<String>) {
        let mut reports = self.0.lock().unwrap_or_else(|e| e.into_inner());
        match report {
            Some(report) => {
                let changed = reports.get(&node).is_none_or(|(old, _)| *old != report);
                if changed {
                    tracing::warn!(%node, %report, "a worker reports trouble with its fence");
                }
                reports.insert(node, (report, Instant::now()));
            }
            None => {
                reports.remove(&node);
            }
        }
    }

    /// Gives each live node of `status` that has a fresh report its report.
    pub(crate) fn show(&self, status: &mut ClusterStatus) {
        let mut reports = self.0.lock().unwrap_or_else(|e| e.into_inner());
        reports.retain(|_, (_, at)| at.elapsed() <= FRESH);
        if reports.is_empty() {
            return;
        }
        for node in status.nodes.iter_mut().filter(|n| n.alive) {
            if let Some((report, _)) = reports.get(&node.id) {
                node.fence = Some(report.clone());
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use escher_proto::types::{Labels, NodeStatus};

    use super::*;

    fn node(id: u64, alive: bool) -> NodeStatus {
        NodeStatus {
            id: NodeId(id),
            name: format!("w{id}"),
            address: String::new(),
            alive,
            labels: Labels::new(),
            resources: Vec::new(),
            left_at_ms: None,
            left_because: None,
            fence: None,
            waiting_for_stream: false,
        }
    }

    #[test]
    fn a_live_node_shows_its_workers_latest_fence_report() {
        let reports = FenceReports::default();
        let mut status = ClusterStatus {
            nodes: vec![node(1, true), node(2, true), node(3, false)],
            pending_tasks: 0,
            running_tasks: 0,
            namespaces: Vec::new(),
            pending_actor_calls: None,
        };
        reports.reported(NodeId(1), Some("restarted 1 time(s)".into()));
        reports.reported(NodeId(1), Some("down: no supervisor".into()));
        reports.reported(NodeId(2), Some("restarted 1 time(s)".into()));
        reports.reported(NodeId(2), None);
        reports.reported(NodeId(3), Some("restarted 1 time(s)".into()));
        reports.show(&mut status);
        assert_eq!(
            status.nodes[0].fence.as_deref(),
            Some("down: no supervisor")
        );
        // Cleared by a later heartbeat; not shown for a node that is not live.
        assert_eq!(status.nodes[1].fence, None);
        assert_eq!(status.nodes[2].fence, None);
    }
}
