//! Read-only views of the state, as the API reports them.

use std::collections::{BTreeMap, BTreeSet};

use escher_proto::types::{
    ClusterStatus, Labels, ListTasksReply, ListTasksRequest, MORE_COUNTED, NAMESPACE_LABEL,
    Namespace, NodeId, NodeStatus, ResourceName, ResourceStatus, TaskCounts, TaskId, TaskInfo,
    TaskState, TaskStatus, TaskSummary,
};

use super::apply::ClusterState;
use super::record::TaskRecord;

impl ClusterState {
    /// A task's status: from its record, or from its tombstone once retention evicted it
    /// (then `evicted` is set and only the final state and finish time are known).
    pub fn status(&self, id: TaskId) -> Option<TaskStatus> {
        if let Some(record) = self.tasks.get(&id) {
            return Some(self.status_of(id, record));
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

    /// A task's status as the API reports it, with the one pending reason `tasks`, `info`,
    /// `status` and JSON show: what it waits for, or why nothing can run it.
    fn status_of(&self, id: TaskId, record: &TaskRecord) -> TaskStatus {
        let mut status = record.status(id);
        if let Some(waiting) = self.awaited_creator(record) {
            status.reason = Some(waiting);
        }
        status
    }

    /// For a pending task that lacks a resource no live node has, when an unfinished task
    /// creates that name (a hook, a ghost, a reservation's holder): the reason to show instead
    /// of "infeasible".
    fn awaited_creator(&self, record: &TaskRecord) -> Option<String> {
        let lacking = record.pending_reason.as_ref()?;
        if record.state != TaskState::Pending || lacking.best_total.is_some() {
            return None;
        }
        let creators = self.creators.get(&lacking.resource)?;
        let first = creators.first()?;
        let others = match creators.len() - 1 {
            0 => String::new(),
            1 => " (and 1 other task)".to_string(),
            n => format!(" (and {n} other tasks)"),
        };
        Some(format!(
            "waiting for resource {}, which no live node has yet: task {first}{others} creates \
             it",
            lacking.resource
        ))
    }

    /// The unfinished (pending or running) tasks of each namespace, as the quota counts them.
    pub fn unfinished_by_namespace(&self) -> &BTreeMap<Namespace, u64> {
        &self.unfinished
    }

    /// The id of every task record retention keeps, in order.
    pub fn task_ids(&self) -> impl Iterator<Item = TaskId> + '_ {
        self.tasks.keys().copied()
    }

    /// Every task record retention keeps, with its namespace (empty for none).
    pub fn task_records(&self) -> impl Iterator<Item = (String, &TaskRecord)> {
        self.tasks.values().map(|rec| {
            let ns = rec.spec.labels.get(NAMESPACE_LABEL).unwrap_or_default();
            (ns.to_string(), &**rec)
        })
    }

    /// The tasks this state keeps, counted by namespace and state, in namespace order (tasks
    /// of no namespace first). One pass over every task.
    pub fn task_counts(&self) -> Vec<TaskCounts> {
        let mut counts: BTreeMap<Option<&str>, TaskCounts> = BTreeMap::new();
        for rec in self.tasks.values() {
            let ns = rec.spec.labels.get(NAMESPACE_LABEL);
            counts
                .entry(ns)
                .or_insert_with(|| TaskCounts {
                    namespace: ns.and_then(|n| Namespace::new(n).ok()),
                    ..TaskCounts::default()
                })
                .add(rec.state);
        }
        counts.into_values().collect()
    }

    /// The unfinished tasks whose hooks or ghost create each resource name.
    pub fn creators_by_name(&self) -> &BTreeMap<ResourceName, BTreeSet<TaskId>> {
        &self.creators
    }

    /// The bytes of task specs each namespace has the head keep, as the quota counts them.
    pub fn spec_bytes_by_namespace(&self) -> &BTreeMap<Namespace, u64> {
        &self.spec_bytes
    }

    /// The bytes of function results each namespace stores, as the quota counts them.
    pub fn result_bytes_by_namespace(&self) -> &BTreeMap<Namespace, u64> {
        &self.result_bytes
    }

    /// A task's record.
    pub fn task(&self, id: TaskId) -> Option<&TaskRecord> {
        self.tasks.get(&id).map(|rec| &**rec)
    }

    /// Everything about one task, while retention keeps its record ([`Self::missing_task`]
    /// says why there is none).
    pub fn task_info(&self, id: TaskId) -> Option<TaskInfo> {
        let rec = self.tasks.get(&id)?;
        let status = self.status_of(id, rec);
        // Waiting for a task to create what it needs is not being infeasible.
        let pending_reason = match self.awaited_creator(rec) {
            Some(_) => None,
            None => rec.pending_reason.as_deref().cloned(),
        };
        Some(TaskInfo {
            spec: rec.spec.clone(),
            status,
            pending_reason,
            submitted_at_ms: rec.submitted_at,
            started_at_ms: rec.started_at,
            finished_at_ms: rec.finished_at,
            attempts: rec.attempt_infos(),
            parent: self.lineage.parent(id),
        })
    }

    /// The tasks `query` asks for, at most `limit`: in id order after `query.after` (in
    /// descending order before it with `newest_first`), every filter applied, and only those
    /// whose namespace (label) `visible` admits. Only tasks whose record retention keeps are
    /// listed. `query.limit` is ignored: the caller gives the page size it allows.
    pub fn list_tasks(
        &self,
        query: &ListTasksRequest,
        limit: usize,
        visible: impl Fn(Option<&str>) -> bool,
    ) -> Vec<TaskSummary> {
        self.list_tasks_counted(query, limit, visible).tasks
    }

    /// [`Self::list_tasks`], and how many more tasks match beyond the page (counted up to
    /// [`MORE_COUNTED`]).
    pub fn list_tasks_counted(
        &self,
        query: &ListTasksRequest,
        limit: usize,
        visible: impl Fn(Option<&str>) -> bool,
    ) -> ListTasksReply {
        use std::ops::Bound::{Excluded, Unbounded};
        let range = match (query.after, query.newest_first) {
            (Some(after), false) => (Excluded(after), Unbounded),
            (Some(before), true) => (Unbounded, Excluded(before)),
            (None, _) => (Unbounded, Unbounded),
        };
        let wanted = |r: &TaskRecord| {
            let labels = &r.spec.labels;
            let ns = labels.get(NAMESPACE_LABEL);
            query.state.is_none_or(|s| r.state == s)
                && query.node.is_none_or(|n| r.node == Some(n))
                && query
                    .name
                    .as_deref()
                    .is_none_or(|name| r.spec.name.contains(name))
                && query
                    .namespace
                    .as_ref()
                    .is_none_or(|q| ns == Some(q.as_str()))
                && query.labels.iter().all(|(key, value)| match value {
                    Some(v) => labels.get(key) == Some(v.as_str()),
                    None => labels.get(key).is_some(),
                })
                && visible(ns)
        };
        let summary = |(id, r): (&TaskId, &TaskRecord)| {
            let status = self.status_of(*id, r);
            TaskSummary {
                id: *id,
                name: r.spec.name.clone(),
                state: r.state,
                node: r.node,
                attempt: r.attempt,
                reason: status.reason,
                resources: r.spec.resources.clone(),
                submitted_at_ms: r.submitted_at,
                started_at_ms: r.started_at,
                finished_at_ms: r.finished_at,
                namespace: r.namespace(),
            }
        };
        let range = self.tasks.range(range).map(|(id, rec)| (id, &**rec));
        let mut found: Box<dyn Iterator<Item = (&TaskId, &TaskRecord)>> = if query.newest_first {
            Box::new(range.rev().filter(|(_, r)| wanted(r)))
        } else {
            Box::new(range.filter(|(_, r)| wanted(r)))
        };
        let tasks = found.by_ref().take(limit).map(summary).collect();
        let more = found.take(MORE_COUNTED as usize).count() as u64;
        ListTasksReply { tasks, more }
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
                // A live node the core does not hold waits for its stream (`nodes.rs`).
                let waiting_for_stream = self.waits_for_stream(*id);
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
                    fence: None,
                    waiting_for_stream,
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
                fence: None,
                waiting_for_stream: false,
            }));
            nodes.sort_by_key(|n| n.id);
        }
        ClusterStatus {
            nodes,
            pending_tasks: self.core.pending_count() as u64,
            running_tasks: self.core.running_count() as u64,
            namespaces: Vec::new(),
            pending_actor_calls: None,
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
