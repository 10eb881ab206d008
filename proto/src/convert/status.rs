//! Conversions of what the API reports: cluster, node and resource status, pending reasons,
//! task info and summaries, and log stream names.

use super::cluster::{namespace, namespace_to_wire};
use super::task::{task_state, task_state_to_wire};
use super::{At, ConvertError, Problem, convert_list, convert_optional, convert_required};
use crate::types::{
    Amount, AttemptInfo, ClusterStatus, Labels, LogStream, MAX_ATTEMPTS_KEPT, Namespace, NodeId,
    NodeStatus, PendingReason, ResourceName, ResourceSet, ResourceStatus, TaskCounts, TaskId,
    TaskInfo, TaskSummary,
};
use crate::wire;

impl From<ResourceStatus> for wire::ResourceStatus {
    fn from(r: ResourceStatus) -> Self {
        wire::ResourceStatus {
            available: r.available().map(Amount::raw),
            name: r.name.into(),
            total: Some(r.total.into()),
            used: r.used.raw(),
        }
    }
}

impl TryFrom<wire::ResourceStatus> for ResourceStatus {
    type Error = ConvertError;

    /// `available` is derived from `total` and `used` and is not read.
    fn try_from(w: wire::ResourceStatus) -> Result<Self, ConvertError> {
        Ok(ResourceStatus {
            name: ResourceName::new(&w.name).at("name")?,
            total: convert_required(w.total, "total")?,
            used: Amount::from_raw(w.used).at("used")?,
        })
    }
}

impl From<NodeStatus> for wire::NodeStatus {
    fn from(n: NodeStatus) -> Self {
        wire::NodeStatus {
            id: n.id.0,
            name: n.name,
            address: n.address,
            alive: n.alive,
            labels: n.labels.into(),
            resources: n.resources.into_iter().map(Into::into).collect(),
            left_at_ms: n.left_at_ms,
            left_because: n.left_because,
            fence: n.fence,
            waiting_for_stream: n.waiting_for_stream,
        }
    }
}

impl TryFrom<wire::NodeStatus> for NodeStatus {
    type Error = ConvertError;
    fn try_from(w: wire::NodeStatus) -> Result<Self, ConvertError> {
        Ok(NodeStatus {
            id: NodeId(w.id),
            name: w.name,
            address: w.address,
            alive: w.alive,
            labels: Labels::try_from(w.labels).at("labels")?,
            resources: convert_list(w.resources, "resources", usize::MAX, TryFrom::try_from)?,
            left_at_ms: w.left_at_ms,
            left_because: w.left_because,
            fence: w.fence,
            waiting_for_stream: w.waiting_for_stream,
        })
    }
}

impl From<ClusterStatus> for wire::ClusterStatusReply {
    fn from(s: ClusterStatus) -> Self {
        wire::ClusterStatusReply {
            nodes: s.nodes.into_iter().map(Into::into).collect(),
            pending_tasks: s.pending_tasks,
            running_tasks: s.running_tasks,
            namespaces: s
                .namespaces
                .into_iter()
                .map(|c| wire::NamespaceTasks {
                    namespace: c.namespace.map(String::from).unwrap_or_default(),
                    pending: c.pending,
                    running: c.running,
                    succeeded: c.succeeded,
                    failed: c.failed,
                    cancelled: c.cancelled,
                })
                .collect(),
            pending_actor_calls: s.pending_actor_calls,
        }
    }
}

impl TryFrom<wire::ClusterStatusReply> for ClusterStatus {
    type Error = ConvertError;
    fn try_from(w: wire::ClusterStatusReply) -> Result<Self, ConvertError> {
        Ok(ClusterStatus {
            nodes: convert_list(w.nodes, "nodes", usize::MAX, TryFrom::try_from)?,
            pending_tasks: w.pending_tasks,
            running_tasks: w.running_tasks,
            namespaces: convert_list(w.namespaces, "namespaces", usize::MAX, |c| {
                let namespace = match c.namespace.as_str() {
                    "" => None,
                    text => Some(Namespace::new(text).at("namespace")?),
                };
                Ok(TaskCounts {
                    namespace,
                    pending: c.pending,
                    running: c.running,
                    succeeded: c.succeeded,
                    failed: c.failed,
                    cancelled: c.cancelled,
                })
            })?,
            pending_actor_calls: w.pending_actor_calls,
        })
    }
}

impl From<PendingReason> for wire::PendingReason {
    fn from(r: PendingReason) -> Self {
        wire::PendingReason {
            resource: r.resource.into(),
            requested: r.requested.raw(),
            best_total: r.best_total.map(Into::into),
            closest_nodes: r.closest_nodes.into_iter().map(|n| n.0).collect(),
            message: r.message,
        }
    }
}

impl TryFrom<wire::PendingReason> for PendingReason {
    type Error = ConvertError;
    fn try_from(w: wire::PendingReason) -> Result<Self, ConvertError> {
        Ok(PendingReason {
            resource: ResourceName::new(&w.resource).at("resource")?,
            requested: Amount::from_raw(w.requested).at("requested")?,
            best_total: convert_optional(w.best_total, "best_total")?,
            closest_nodes: w.closest_nodes.into_iter().map(NodeId).collect(),
            message: w.message,
        })
    }
}

impl From<TaskInfo> for wire::TaskInfo {
    fn from(t: TaskInfo) -> Self {
        wire::TaskInfo {
            spec: Some(t.spec.into()),
            status: Some(t.status.into()),
            pending_reason: t.pending_reason.map(Into::into),
            submitted_at_ms: t.submitted_at_ms,
            started_at_ms: t.started_at_ms,
            finished_at_ms: t.finished_at_ms,
            attempts: t
                .attempts
                .into_iter()
                .map(|a| wire::AttemptInfo {
                    attempt: a.attempt,
                    node: a.node.0,
                    started_at_ms: a.started_at_ms,
                    ended: a.ended,
                    output_kept: a.output_kept,
                })
                .collect(),
            parent_task_id: t.parent.map(|p| p.0),
        }
    }
}

impl TryFrom<wire::TaskInfo> for TaskInfo {
    type Error = ConvertError;
    fn try_from(w: wire::TaskInfo) -> Result<Self, ConvertError> {
        Ok(TaskInfo {
            spec: convert_required(w.spec, "spec")?,
            status: convert_required(w.status, "status")?,
            pending_reason: convert_optional(w.pending_reason, "pending_reason")?,
            submitted_at_ms: w.submitted_at_ms,
            started_at_ms: w.started_at_ms,
            finished_at_ms: w.finished_at_ms,
            attempts: convert_list(w.attempts, "attempts", MAX_ATTEMPTS_KEPT, |a| {
                Ok::<_, ConvertError>(AttemptInfo {
                    attempt: a.attempt,
                    node: NodeId(a.node),
                    started_at_ms: a.started_at_ms,
                    ended: a.ended,
                    output_kept: a.output_kept,
                })
            })?,
            parent: w.parent_task_id.map(TaskId),
        })
    }
}

impl From<TaskSummary> for wire::TaskSummary {
    fn from(t: TaskSummary) -> Self {
        wire::TaskSummary {
            id: t.id.0,
            name: t.name,
            state: task_state_to_wire(t.state),
            node: t.node.map(|n| n.0),
            attempt: t.attempt,
            reason: t.reason,
            resources: t.resources.into(),
            submitted_at_ms: t.submitted_at_ms,
            started_at_ms: t.started_at_ms,
            finished_at_ms: t.finished_at_ms,
            namespace: namespace_to_wire(t.namespace),
        }
    }
}

impl TryFrom<wire::TaskSummary> for TaskSummary {
    type Error = ConvertError;
    fn try_from(w: wire::TaskSummary) -> Result<Self, ConvertError> {
        Ok(TaskSummary {
            id: TaskId(w.id),
            name: w.name,
            state: task_state(w.state, "state")?,
            node: w.node.map(NodeId),
            attempt: w.attempt,
            reason: w.reason,
            resources: ResourceSet::try_from(w.resources).at("resources")?,
            submitted_at_ms: w.submitted_at_ms,
            started_at_ms: w.started_at_ms,
            finished_at_ms: w.finished_at_ms,
            namespace: namespace(w.namespace)?,
        })
    }
}

impl From<LogStream> for wire::LogStream {
    fn from(s: LogStream) -> Self {
        match s {
            LogStream::Stdout => wire::LogStream::Stdout,
            LogStream::Stderr => wire::LogStream::Stderr,
        }
    }
}

/// Reads an enum field holding a `LogStream`; errors are at `field`.
pub(crate) fn log_stream(value: i32, field: &str) -> Result<LogStream, ConvertError> {
    match wire::LogStream::try_from(value) {
        Ok(wire::LogStream::Stdout) => Ok(LogStream::Stdout),
        Ok(wire::LogStream::Stderr) => Ok(LogStream::Stderr),
        Ok(wire::LogStream::Unspecified) | Err(_) => Err(ConvertError::new(
            field,
            Problem::UnknownEnum {
                value,
                expected: "STDOUT, STDERR",
            },
        )),
    }
}

/// The `i32` an enum field holding `stream` carries.
pub(crate) fn log_stream_to_wire(stream: LogStream) -> i32 {
    wire::LogStream::from(stream).into()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::convert::testutil::{amount, name, round_trip, sample_specs, sample_statuses};
    use crate::types::{Capacity, TaskState};

    fn sample_node() -> NodeStatus {
        let r = |n: &str, total: &str, used: &str| ResourceStatus {
            name: name(n),
            total: total.parse().unwrap(),
            used: amount(used),
        };
        NodeStatus {
            id: NodeId(4),
            name: "worker-4".into(),
            address: "10.0.0.4:7601".into(),
            alive: true,
            labels: "zone=b".parse().unwrap(),
            resources: vec![
                r("cpu", "8", "3.5"),
                r("app/slot", "1", "2"),
                r("loc", "inf", "1"),
            ],
            left_at_ms: None,
            left_because: None,
            fence: Some("restarted 1 time(s)".into()),
            waiting_for_stream: true,
        }
    }

    #[test]
    fn cluster_status_round_trips_and_derives_available() {
        let status = ClusterStatus {
            nodes: vec![
                sample_node(),
                NodeStatus {
                    alive: false,
                    left_at_ms: Some(1_700_000_000_000),
                    left_because: Some("no heartbeat for 10s".into()),
                    ..sample_node()
                },
            ],
            pending_tasks: 7,
            running_tasks: 3,
            namespaces: Vec::new(),
            pending_actor_calls: None,
        };
        let w = round_trip::<_, wire::ClusterStatusReply>(status);
        let avail: Vec<_> = w.nodes[0].resources.iter().map(|r| r.available).collect();
        assert_eq!(avail, [Some(45_000), Some(0), None]);
        round_trip::<_, wire::ClusterStatusReply>(ClusterStatus::default());
    }

    #[test]
    fn node_status_errors_name_the_resource() {
        let mut w = wire::NodeStatus::from(sample_node());
        w.resources[1].total = None;
        let e = NodeStatus::try_from(w.clone()).unwrap_err();
        assert_eq!(e.to_string(), "missing field resources[1].total");
        w.resources[1].total = Some(Capacity::Unbounded.into());
        w.resources[2].used = u64::MAX;
        assert_eq!(
            NodeStatus::try_from(w).unwrap_err().path(),
            "resources[2].used"
        );
    }

    #[test]
    fn task_info_and_summary_round_trip() {
        let reason = PendingReason {
            resource: name("gpu"),
            requested: amount("2"),
            best_total: Some(Capacity::Finite(amount("1"))),
            closest_nodes: vec![NodeId(3), NodeId(1)],
            message: "needs gpu=2; the largest node has gpu=1".into(),
        };
        let specs = sample_specs();
        let statuses = sample_statuses();
        for (spec, status) in specs.into_iter().zip(statuses) {
            let info = TaskInfo {
                spec: spec.clone(),
                status: status.clone(),
                pending_reason: Some(reason.clone()),
                submitted_at_ms: 1_700_000_000_000,
                started_at_ms: Some(1_700_000_000_100),
                finished_at_ms: None,
                attempts: vec![
                    AttemptInfo {
                        attempt: 1,
                        node: NodeId(2),
                        started_at_ms: 1_700_000_000_050,
                        ended: Some("exited with code 1".into()),
                        output_kept: true,
                    },
                    AttemptInfo {
                        attempt: 2,
                        node: NodeId(3),
                        started_at_ms: 1_700_000_000_100,
                        ended: None,
                        output_kept: false,
                    },
                ],
                parent: Some(TaskId(7)),
            };
            round_trip::<_, wire::TaskInfo>(info);
            let summary = TaskSummary {
                id: status.id,
                name: spec.name,
                state: status.state,
                node: status.node,
                attempt: status.attempt,
                reason: status.reason,
                resources: spec.resources,
                submitted_at_ms: 1_700_000_000_000,
                started_at_ms: Some(1_700_000_000_100),
                finished_at_ms: Some(1_700_000_000_200),
                namespace: Some(crate::types::Namespace::new("team-a").unwrap()),
            };
            round_trip::<_, wire::TaskSummary>(summary);
        }
        round_trip::<_, wire::PendingReason>(PendingReason {
            best_total: None,
            ..reason
        });
    }

    #[test]
    fn task_info_errors() {
        let e = TaskInfo::try_from(wire::TaskInfo::default()).unwrap_err();
        assert_eq!(e.to_string(), "missing field spec");
        let w = wire::TaskInfo {
            spec: Some(sample_specs().remove(0).into()),
            ..Default::default()
        };
        assert_eq!(
            TaskInfo::try_from(w.clone()).unwrap_err().to_string(),
            "missing field status"
        );
        let mut spec = w.spec.clone().unwrap();
        spec.kind = None;
        let w = wire::TaskInfo {
            spec: Some(spec),
            ..w
        };
        assert_eq!(
            TaskInfo::try_from(w).unwrap_err().to_string(),
            "missing field spec.kind"
        );
        let w = wire::TaskSummary {
            state: task_state_to_wire(TaskState::Failed),
            ..Default::default()
        };
        assert!(TaskSummary::try_from(w).is_ok());
    }

    #[test]
    fn log_streams() {
        for s in [LogStream::Stdout, LogStream::Stderr] {
            assert_eq!(log_stream(log_stream_to_wire(s), "stream").unwrap(), s);
        }
        let e = log_stream(0, "stream").unwrap_err();
        assert_eq!(
            e.to_string(),
            "stream: unknown value 0; expected one of STDOUT, STDERR"
        );
        assert!(log_stream(3, "stream").is_err());
    }
}
