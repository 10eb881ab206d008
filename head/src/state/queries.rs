//! Read-only views of the state, as the API reports them.

use std::collections::BTreeMap;

use escher_proto::types::{
    ClusterStatus, Labels, Namespace, NodeId, NodeStatus, ResourceStatus, TaskId, TaskInfo,
    TaskState, TaskStatus, TaskSummary,
};

use super::apply::ClusterState;
use super::record::TaskRecord;

impl ClusterState {
    /// A task's status: from its record, or from its tombstone once retention evicted it
    /// (then `evicted` is set and only the final state and finish time are known).
    pub fn status(&self, id: TaskId) -> Option<TaskStatus> {
        if let Some(record) = self.tasks.get(&id) {
            return Some(record.status(id));
        }
        let tombstone = self.retention.tombstone(id)?;
        Some(TaskStatus {
            id,
            state: tombstone.state,
            node: None,
            attempt: 0,
            reason: None,
            result: None,
            evicted: true,
            finished_at_ms: Some(tombstone.finished_at_ms),
            hook_errors: Vec::new(),
        })
    }

    /// The unfinished (pending or running) tasks of each namespace, as the quota counts them.
    pub fn unfinished_by_namespace(&self) -> &BTreeMap<Namespace, u64> {
        &self.unfinished
    }

    /// The bytes of function results each namespace stores, as the quota counts them.
    pub fn result_bytes_by_namespace(&self) -> &BTreeMap<Namespace, u64> {
        &self.result_bytes
    }

    /// A task's record.
    pub fn task(&self, id: TaskId) -> Option<&TaskRecord> {
        self.tasks.get(&id)
    }

    /// Everything about one task, while retention keeps its record ([`Self::missing_task`]
    /// says why there is none).
    pub fn task_info(&self, id: TaskId) -> Option<TaskInfo> {
        let rec = self.tasks.get(&id)?;
        Some(TaskInfo {
            spec: rec.spec.clone(),
            status: rec.status(id),
            pending_reason: rec.pending_reason.clone(),
            submitted_at_ms: rec.submitted_at,
            started_at_ms: rec.started_at,
            finished_at_ms: rec.finished_at,
        })
    }

    /// Tasks in id order after `after`, optionally in one state, whose namespace (label)
    /// `visible` admits, at most `limit`. Only tasks
    /// whose record retention keeps are listed.
    pub fn list_tasks(
        &self,
        state: Option<TaskState>,
        limit: usize,
        after: Option<TaskId>,
        visible: impl Fn(Option<&str>) -> bool,
    ) -> Vec<TaskSummary> {
        let start = after.map_or(std::ops::Bound::Unbounded, std::ops::Bound::Excluded);
        self.tasks
            .range((start, std::ops::Bound::Unbounded))
            .filter(|(_, r)| state.is_none_or(|s| r.state == s))
            .filter(|(_, r)| visible(r.spec.labels.get(escher_proto::types::NAMESPACE_LABEL)))
            .take(limit)
            .map(|(id, r)| {
                let status = r.status(*id);
                TaskSummary {
                    id: *id,
                    name: r.spec.name.clone(),
                    state: r.state,
                    node: r.node,
                    attempt: r.attempt,
                    reason: status.reason,
                    resources: r.spec.resources.clone(),
                }
            })
            .collect()
    }

    /// Every node the head has seen and still remembers (retention shrinks long-dead nodes to
    /// their name and when and why they left, and forgets the oldest of those), live ones with
    /// their resources (a lost node's resources are gone), and the number of pending and
    /// running tasks.
    pub fn cluster_status(&self) -> ClusterStatus {
        let mut nodes: Vec<NodeStatus> = self
            .nodes
            .iter()
            .map(|(id, rec)| {
                let resources = self
                    .core
                    .node(*id)
                    .map(|view| {
                        view.resources
                            .into_iter()
                            .map(|r| ResourceStatus {
                                name: r.name,
                                total: r.total,
                                used: r.used,
                            })
                            .collect()
                    })
                    .unwrap_or_default();
                NodeStatus {
                    id: *id,
                    name: rec.name.clone(),
                    address: rec.address.clone(),
                    alive: rec.alive,
                    labels: rec.labels.clone(),
                    resources,
                    left_at_ms: rec.left_at,
                    left_because: rec.gone_because.clone(),
                }
            })
            .collect();
        if !self.retention.departed().is_empty() {
            nodes.extend(self.retention.departed().iter().map(|(id, t)| NodeStatus {
                id: *id,
                name: t.name.clone(),
                address: String::new(),
                alive: false,
                labels: Labels::new(),
                resources: Vec::new(),
                left_at_ms: Some(t.left_at),
                left_because: t.because.clone(),
            }));
            nodes.sort_by_key(|n| n.id);
        }
        ClusterStatus {
            nodes,
            pending_tasks: self.core.pending_count() as u64,
            running_tasks: self.core.running_count() as u64,
        }
    }

    /// A node's record, live or not.
    pub fn node(&self, id: NodeId) -> Option<&super::record::NodeRecord> {
        self.nodes.get(&id)
    }

    /// Whether a node is live.
    pub fn node_alive(&self, id: NodeId) -> bool {
        self.nodes.get(&id).is_some_and(|n| n.alive)
    }

    /// Whether a node is live and draining.
    pub fn node_draining(&self, id: NodeId) -> bool {
        self.nodes.get(&id).is_some_and(|n| n.alive && n.draining)
    }

    /// Live node ids.
    pub fn live_nodes(&self) -> Vec<NodeId> {
        self.nodes
            .iter()
            .filter(|(_, n)| n.alive)
            .map(|(id, _)| *id)
            .collect()
    }

    /// Tasks the head believes run on `node`, with their attempts.
    pub fn running_on(&self, node: NodeId) -> Vec<(TaskId, u32)> {
        self.core
            .node(node)
            .map(|v| {
                v.running
                    .iter()
                    .map(|t| (*t, self.tasks.get(t).map_or(0, |r| r.attempt)))
                    .collect()
            })
            .unwrap_or_default()
    }
}
