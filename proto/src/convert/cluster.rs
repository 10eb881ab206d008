//! Conversions of the requests and replies of the `Cluster` service.
//!
//! `DescribeTask` takes a bare [`TaskId`] and answers a [`crate::TaskInfo`];
//! `ClusterStatus` takes the empty [`wire::ClusterStatusRequest`] and answers a
//! [`crate::ClusterStatus`]; both replies convert in `status`.

use std::collections::HashSet;

use super::status::{log_stream, log_stream_to_wire};
use super::task::{task_state, task_state_to_wire};
use super::{
    At, ConvertError, MAX_NAME_BYTES, Problem, check_len, convert_list, duration_to_ms,
    ms_to_duration, non_empty,
};
use crate::types::{
    CancelReply, CancelRequest, ListTasksReply, ListTasksRequest, LogChunk, MAX_LABEL_SELECTORS,
    Namespace, NodeId, RequestKey, SetResourceOutcome, SetResourcesReply, SetResourcesRequest,
    SubmitReply, SubmitRequest, TaskId, TaskLogsRequest, WaitReply, WaitRequest,
};
use crate::wire;

/// Reads a namespace field, where empty means none.
pub(super) fn namespace(text: String) -> Result<Option<Namespace>, ConvertError> {
    if text.is_empty() {
        return Ok(None);
    }
    Namespace::new(&text).map(Some).at("namespace")
}

pub(super) fn namespace_to_wire(ns: Option<Namespace>) -> String {
    ns.map(String::from).unwrap_or_default()
}

/// Reads a label selector: `KEY=VALUE`, or `KEY` for any value.
pub(super) fn label_selector(text: String) -> Result<(String, Option<String>), ConvertError> {
    check_len("", &text, MAX_NAME_BYTES)?;
    let (key, value) = match text.split_once('=') {
        Some((k, v)) => (k.to_string(), Some(v.to_string())),
        None => (text, None),
    };
    if key.is_empty() {
        let why = "a label selector is KEY=VALUE or KEY, and KEY must not be empty";
        return Err(ConvertError::new("", Problem::Rule(why)));
    }
    Ok((key, value))
}

/// Label selectors as they travel.
pub(super) fn selectors_to_wire(selectors: Vec<(String, Option<String>)>) -> Vec<String> {
    selectors
        .into_iter()
        .map(|(k, v)| match v {
            Some(v) => format!("{k}={v}"),
            None => k,
        })
        .collect()
}

fn ids_to_wire(ids: Vec<TaskId>) -> Vec<u64> {
    ids.into_iter().map(|t| t.0).collect()
}

fn ids(raw: Vec<u64>) -> Vec<TaskId> {
    raw.into_iter().map(TaskId).collect()
}

impl From<RequestKey> for wire::RequestKey {
    fn from(k: RequestKey) -> Self {
        wire::RequestKey {
            client: k.client,
            seq: k.seq,
            first_incomplete: k.first_incomplete,
        }
    }
}

impl TryFrom<wire::RequestKey> for RequestKey {
    type Error = ConvertError;
    fn try_from(w: wire::RequestKey) -> Result<Self, ConvertError> {
        let rule = |path: &str, why| Err(ConvertError::new(path, Problem::Rule(why)));
        if w.client == 0 {
            return rule("key.client", "must not be 0");
        }
        if w.seq == 0 {
            return rule("key.seq", "must be at least 1");
        }
        if w.first_incomplete == 0 || w.first_incomplete > w.seq {
            return rule("key.first_incomplete", "must be between 1 and seq");
        }
        Ok(RequestKey {
            client: w.client,
            seq: w.seq,
            first_incomplete: w.first_incomplete,
        })
    }
}

impl From<SubmitRequest> for wire::SubmitRequest {
    fn from(r: SubmitRequest) -> Self {
        wire::SubmitRequest {
            tasks: r.tasks.into_iter().map(Into::into).collect(),
            namespace: namespace_to_wire(r.namespace),
            key: None,
        }
    }
}

impl TryFrom<wire::SubmitRequest> for SubmitRequest {
    type Error = ConvertError;
    fn try_from(w: wire::SubmitRequest) -> Result<Self, ConvertError> {
        Ok(SubmitRequest {
            namespace: namespace(w.namespace)?,
            tasks: convert_list(w.tasks, "tasks", usize::MAX, TryFrom::try_from)?,
        })
    }
}

impl From<SubmitReply> for wire::SubmitReply {
    fn from(r: SubmitReply) -> Self {
        wire::SubmitReply {
            task_ids: ids_to_wire(r.task_ids),
        }
    }
}

impl From<wire::SubmitReply> for SubmitReply {
    fn from(w: wire::SubmitReply) -> Self {
        SubmitReply {
            task_ids: ids(w.task_ids),
        }
    }
}

impl From<WaitRequest> for wire::WaitRequest {
    fn from(r: WaitRequest) -> Self {
        wire::WaitRequest {
            task_ids: ids_to_wire(r.task_ids),
            num_returns: r.num_returns,
            timeout_ms: r.timeout.map(duration_to_ms),
        }
    }
}

impl TryFrom<wire::WaitRequest> for WaitRequest {
    type Error = ConvertError;

    /// Checks that ids are distinct and that `1 <= num_returns <= ids` (or both are zero).
    fn try_from(w: wire::WaitRequest) -> Result<Self, ConvertError> {
        let mut seen = HashSet::with_capacity(w.task_ids.len());
        for (i, id) in w.task_ids.iter().enumerate() {
            if !seen.insert(*id) {
                let twice = Problem::Rule("this task id is listed twice");
                return Err(ConvertError::new(format!("task_ids[{i}]"), twice));
            }
        }
        let rule = |why| Err(ConvertError::new("num_returns", Problem::Rule(why)));
        if w.num_returns as usize > w.task_ids.len() {
            return rule("is larger than the number of task ids");
        }
        if w.num_returns == 0 && !w.task_ids.is_empty() {
            return rule("must be at least 1");
        }
        Ok(WaitRequest {
            task_ids: ids(w.task_ids),
            num_returns: w.num_returns,
            timeout: w.timeout_ms.map(ms_to_duration),
        })
    }
}

impl From<WaitReply> for wire::WaitReply {
    fn from(r: WaitReply) -> Self {
        wire::WaitReply {
            ready: r.ready.into_iter().map(Into::into).collect(),
            not_ready: ids_to_wire(r.not_ready),
        }
    }
}

impl TryFrom<wire::WaitReply> for WaitReply {
    type Error = ConvertError;
    fn try_from(w: wire::WaitReply) -> Result<Self, ConvertError> {
        Ok(WaitReply {
            ready: convert_list(w.ready, "ready", usize::MAX, TryFrom::try_from)?,
            not_ready: ids(w.not_ready),
        })
    }
}

impl From<CancelRequest> for wire::CancelRequest {
    fn from(r: CancelRequest) -> Self {
        wire::CancelRequest {
            task_ids: ids_to_wire(r.task_ids),
            recursive: r.recursive,
            force: r.force,
            key: None,
        }
    }
}

impl From<wire::CancelRequest> for CancelRequest {
    fn from(w: wire::CancelRequest) -> Self {
        CancelRequest {
            task_ids: ids(w.task_ids),
            recursive: w.recursive,
            force: w.force,
        }
    }
}

impl From<CancelReply> for wire::CancelReply {
    fn from(r: CancelReply) -> Self {
        wire::CancelReply {
            tasks: r.tasks.into_iter().map(Into::into).collect(),
        }
    }
}

impl TryFrom<wire::CancelReply> for CancelReply {
    type Error = ConvertError;
    fn try_from(w: wire::CancelReply) -> Result<Self, ConvertError> {
        Ok(CancelReply {
            tasks: convert_list(w.tasks, "tasks", usize::MAX, TryFrom::try_from)?,
        })
    }
}

impl From<TaskId> for wire::DescribeTaskRequest {
    fn from(id: TaskId) -> Self {
        wire::DescribeTaskRequest { task_id: id.0 }
    }
}

impl From<wire::DescribeTaskRequest> for TaskId {
    fn from(w: wire::DescribeTaskRequest) -> Self {
        TaskId(w.task_id)
    }
}

impl From<ListTasksRequest> for wire::ListTasksRequest {
    fn from(r: ListTasksRequest) -> Self {
        wire::ListTasksRequest {
            state: r.state.map(task_state_to_wire),
            limit: r.limit,
            after_id: r.after.map(|t| t.0),
            name: r.name.unwrap_or_default(),
            labels: selectors_to_wire(r.labels),
            node: r.node.map(|n| n.0),
            namespace: namespace_to_wire(r.namespace),
            newest_first: r.newest_first,
        }
    }
}

impl TryFrom<wire::ListTasksRequest> for ListTasksRequest {
    type Error = ConvertError;
    fn try_from(w: wire::ListTasksRequest) -> Result<Self, ConvertError> {
        check_len("name", &w.name, MAX_NAME_BYTES)?;
        Ok(ListTasksRequest {
            state: w.state.map(|s| task_state(s, "state")).transpose()?,
            limit: w.limit,
            after: w.after_id.map(TaskId),
            name: non_empty(w.name),
            labels: convert_list(w.labels, "labels", MAX_LABEL_SELECTORS, label_selector)?,
            node: w.node.map(NodeId),
            namespace: namespace(w.namespace)?,
            newest_first: w.newest_first,
        })
    }
}

impl From<ListTasksReply> for wire::ListTasksReply {
    fn from(r: ListTasksReply) -> Self {
        wire::ListTasksReply {
            tasks: r.tasks.into_iter().map(Into::into).collect(),
            more: r.more,
        }
    }
}

impl TryFrom<wire::ListTasksReply> for ListTasksReply {
    type Error = ConvertError;
    fn try_from(w: wire::ListTasksReply) -> Result<Self, ConvertError> {
        Ok(ListTasksReply {
            tasks: convert_list(w.tasks, "tasks", usize::MAX, TryFrom::try_from)?,
            more: w.more,
        })
    }
}

impl From<SetResourcesRequest> for wire::SetResourcesRequest {
    fn from(r: SetResourcesRequest) -> Self {
        wire::SetResourcesRequest {
            updates: r.updates.into_iter().map(Into::into).collect(),
            namespace: namespace_to_wire(r.namespace),
            key: None,
        }
    }
}

impl TryFrom<wire::SetResourcesRequest> for SetResourcesRequest {
    type Error = ConvertError;
    fn try_from(w: wire::SetResourcesRequest) -> Result<Self, ConvertError> {
        Ok(SetResourcesRequest {
            updates: convert_list(w.updates, "updates", usize::MAX, TryFrom::try_from)?,
            namespace: namespace(w.namespace)?,
            caller_task: None,
        })
    }
}

impl From<SetResourcesReply> for wire::SetResourcesReply {
    fn from(r: SetResourcesReply) -> Self {
        let outcome = |o: SetResourceOutcome| wire::SetResourceOutcome {
            nodes: o.nodes.into_iter().map(|n| n.0).collect(),
        };
        wire::SetResourcesReply {
            outcomes: r.outcomes.into_iter().map(outcome).collect(),
        }
    }
}

impl From<wire::SetResourcesReply> for SetResourcesReply {
    fn from(w: wire::SetResourcesReply) -> Self {
        let outcome = |o: wire::SetResourceOutcome| SetResourceOutcome {
            nodes: o.nodes.into_iter().map(NodeId).collect(),
        };
        SetResourcesReply {
            outcomes: w.outcomes.into_iter().map(outcome).collect(),
        }
    }
}

impl From<TaskLogsRequest> for wire::TaskLogsRequest {
    fn from(r: TaskLogsRequest) -> Self {
        wire::TaskLogsRequest {
            task_id: r.task_id.0,
            stream: log_stream_to_wire(r.stream),
            offset: r.offset,
            max_bytes: r.max_bytes,
            attempt: r.attempt.unwrap_or(0),
        }
    }
}

impl TryFrom<wire::TaskLogsRequest> for TaskLogsRequest {
    type Error = ConvertError;
    fn try_from(w: wire::TaskLogsRequest) -> Result<Self, ConvertError> {
        Ok(TaskLogsRequest {
            task_id: TaskId(w.task_id),
            stream: log_stream(w.stream, "stream")?,
            offset: w.offset,
            max_bytes: w.max_bytes,
            attempt: (w.attempt != 0).then_some(w.attempt),
        })
    }
}

impl From<LogChunk> for wire::TaskLogsReply {
    fn from(c: LogChunk) -> Self {
        wire::TaskLogsReply {
            data: c.data,
            next_offset: c.next_offset,
            eof: c.eof,
            attempt: c.attempt,
            notice: c.notice.unwrap_or_default(),
        }
    }
}

impl From<wire::TaskLogsReply> for LogChunk {
    fn from(w: wire::TaskLogsReply) -> Self {
        LogChunk {
            data: w.data,
            next_offset: w.next_offset,
            eof: w.eof,
            attempt: w.attempt,
            notice: non_empty(w.notice),
        }
    }
}

/// A status carried inside a stream: its code, message and metadata (binary entries as their
/// bytes), so that the receiver rebuilds the status a unary call would have returned.
impl From<&tonic::Status> for wire::CallError {
    fn from(status: &tonic::Status) -> Self {
        use tonic::metadata::KeyAndValueRef;
        let metadata = status
            .metadata()
            .iter()
            .filter_map(|entry| match entry {
                KeyAndValueRef::Ascii(key, value) => {
                    Some((key.as_str().to_string(), value.as_bytes().to_vec()))
                }
                KeyAndValueRef::Binary(key, value) => value
                    .to_bytes()
                    .ok()
                    .map(|bytes| (key.as_str().to_string(), bytes.to_vec())),
            })
            .collect();
        wire::CallError {
            code: status.code() as i32,
            message: status.message().to_string(),
            metadata,
        }
    }
}

/// The status a [`wire::CallError`] stands for. An entry that is not valid metadata (which a
/// head never sends) is left out rather than failing the whole answer.
impl From<wire::CallError> for tonic::Status {
    fn from(error: wire::CallError) -> Self {
        use tonic::metadata::{BinaryMetadataKey, MetadataKey, MetadataMap, MetadataValue};
        let mut metadata = MetadataMap::new();
        for (key, value) in error.metadata {
            if key.ends_with("-bin") {
                if let Ok(key) = BinaryMetadataKey::from_bytes(key.as_bytes()) {
                    metadata.insert_bin(key, MetadataValue::from_bytes(&value));
                }
            } else if let (Ok(key), Ok(value)) = (
                MetadataKey::from_bytes(key.as_bytes()),
                MetadataValue::try_from(value.as_slice()),
            ) {
                metadata.insert(key, value);
            }
        }
        tonic::Status::with_metadata(tonic::Code::from(error.code), error.message, metadata)
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;
    use crate::convert::testutil::{name, round_trip, sample_specs, sample_statuses};
    use crate::types::{CapacityOp, LogStream, NodeSpec, ResourceUpdate, TaskState};

    #[test]
    fn submit_round_trips_and_names_the_bad_task() {
        let req = SubmitRequest {
            tasks: sample_specs(),
            namespace: Some("app-a".parse().unwrap()),
        };
        let w = round_trip::<_, wire::SubmitRequest>(req);
        round_trip::<_, wire::SubmitRequest>(SubmitRequest {
            tasks: vec![],
            namespace: None,
        });
        let mut bad = w.clone();
        bad.tasks[3].resources.push(wire::ResourceAmount {
            name: "b@d".into(),
            amount: 1,
        });
        let e = SubmitRequest::try_from(bad).unwrap_err().to_string();
        assert!(
            e.starts_with(r#"tasks[3].resources["b@d"]: invalid resource name"#),
            "{e}"
        );
        let mut bad = w.clone();
        bad.tasks[0].kind = None;
        assert_eq!(
            SubmitRequest::try_from(bad).unwrap_err().to_string(),
            "missing field tasks[0].kind"
        );
        let bad = wire::SubmitRequest {
            namespace: "a/b".into(),
            ..w
        };
        assert_eq!(
            SubmitRequest::try_from(bad).unwrap_err().path(),
            "namespace"
        );
        let reply = SubmitReply {
            task_ids: vec![TaskId(1), TaskId(2)],
        };
        assert_eq!(
            SubmitReply::from(wire::SubmitReply::from(reply.clone())),
            reply
        );
    }

    #[test]
    fn wait_round_trips_and_checks_num_returns() {
        let req = WaitRequest {
            task_ids: vec![TaskId(5), TaskId(1)],
            num_returns: 2,
            timeout: Some(Duration::from_millis(1500)),
        };
        round_trip::<_, wire::WaitRequest>(req);
        round_trip::<_, wire::WaitRequest>(WaitRequest {
            task_ids: vec![],
            num_returns: 0,
            timeout: None,
        });
        let w = |ids: Vec<u64>, n| wire::WaitRequest {
            task_ids: ids,
            num_returns: n,
            timeout_ms: None,
        };
        let e = WaitRequest::try_from(w(vec![1], 2)).unwrap_err();
        assert_eq!(
            e.to_string(),
            "num_returns: is larger than the number of task ids"
        );
        assert_eq!(
            WaitRequest::try_from(w(vec![1], 0)).unwrap_err().path(),
            "num_returns"
        );
        assert_eq!(
            WaitRequest::try_from(w(vec![1, 2, 1], 1))
                .unwrap_err()
                .path(),
            "task_ids[2]"
        );
        let reply = WaitReply {
            ready: sample_statuses(),
            not_ready: vec![TaskId(9)],
        };
        round_trip::<_, wire::WaitReply>(reply);
    }

    #[test]
    fn cancel_describe_and_list_round_trip() {
        let req = CancelRequest {
            task_ids: vec![TaskId(3)],
            recursive: true,
            force: false,
        };
        assert_eq!(
            CancelRequest::from(wire::CancelRequest::from(req.clone())),
            req
        );
        round_trip::<_, wire::CancelReply>(CancelReply {
            tasks: sample_statuses(),
        });
        assert_eq!(
            TaskId::from(wire::DescribeTaskRequest::from(TaskId(8))),
            TaskId(8)
        );
        for state in [None, Some(TaskState::Pending), Some(TaskState::Cancelled)] {
            let req = ListTasksRequest {
                state,
                limit: 50,
                after: Some(TaskId(0)),
                ..ListTasksRequest::default()
            };
            round_trip::<_, wire::ListTasksRequest>(req);
        }
        round_trip::<_, wire::ListTasksRequest>(ListTasksRequest::default());
        round_trip::<_, wire::ListTasksRequest>(ListTasksRequest {
            name: Some("train".into()),
            labels: vec![("team".into(), Some("a".into())), ("urgent".into(), None)],
            node: Some(NodeId(3)),
            namespace: Some(Namespace::new("team-a").unwrap()),
            newest_first: true,
            ..ListTasksRequest::default()
        });
        let empty_key = wire::ListTasksRequest {
            labels: vec!["=a".into()],
            ..Default::default()
        };
        let err = ListTasksRequest::try_from(empty_key).unwrap_err();
        assert_eq!(err.path(), "labels[0]");
        let bad = wire::ListTasksRequest {
            state: Some(0),
            ..Default::default()
        };
        assert_eq!(ListTasksRequest::try_from(bad).unwrap_err().path(), "state");
        round_trip::<_, wire::ListTasksReply>(ListTasksReply::default());
    }

    #[test]
    fn set_resources_round_trips() {
        let update = |op| ResourceUpdate {
            name: name("slot"),
            op,
            target: NodeSpec::Local,
        };
        let req = SetResourcesRequest {
            updates: vec![
                update(CapacityOp::Delete),
                update(CapacityOp::Adjust("-1".parse().unwrap())),
            ],
            namespace: Some("app".parse().unwrap()),
            caller_task: None,
        };
        let w = round_trip::<_, wire::SetResourcesRequest>(req);
        let mut bad = w;
        bad.updates[1].op = Some(wire::CapacityOp { op: None });
        let e = SetResourcesRequest::try_from(bad).unwrap_err();
        assert_eq!(e.to_string(), "missing field updates[1].op.op");
        let reply = SetResourcesReply {
            outcomes: vec![
                SetResourceOutcome {
                    nodes: vec![NodeId(1), NodeId(2)],
                },
                Default::default(),
            ],
        };
        assert_eq!(
            SetResourcesReply::from(wire::SetResourcesReply::from(reply.clone())),
            reply
        );
    }

    #[test]
    fn task_logs_round_trip() {
        let req = TaskLogsRequest {
            task_id: TaskId(4),
            stream: LogStream::Stderr,
            offset: 10,
            max_bytes: 0,
            attempt: Some(2),
        };
        round_trip::<_, wire::TaskLogsRequest>(req);
        let latest = TaskLogsRequest {
            attempt: None,
            ..req
        };
        round_trip::<_, wire::TaskLogsRequest>(latest);
        let bad = wire::TaskLogsRequest::default();
        assert_eq!(TaskLogsRequest::try_from(bad).unwrap_err().path(), "stream");
        let chunk = LogChunk {
            data: b"hello\n".to_vec(),
            next_offset: 16,
            eof: true,
            attempt: 3,
            notice: Some("kept by the head".into()),
        };
        assert_eq!(
            LogChunk::from(wire::TaskLogsReply::from(chunk.clone())),
            chunk
        );
    }

    #[test]
    fn a_status_crosses_a_stream_with_its_metadata() {
        let mut status = tonic::Status::unavailable("not the leader");
        status.metadata_mut().insert(
            "escher-leader",
            tonic::metadata::MetadataValue::from_static("http://127.0.0.1:7601"),
        );
        status.metadata_mut().insert_bin(
            "escher-evicted-bin",
            tonic::metadata::MetadataValue::from_bytes(&[0, 1, 2, 255]),
        );
        let back = tonic::Status::from(wire::CallError::from(&status));
        assert_eq!(back.code(), tonic::Code::Unavailable);
        assert_eq!(back.message(), "not the leader");
        assert_eq!(
            back.metadata().get("escher-leader").unwrap(),
            "http://127.0.0.1:7601"
        );
        let bytes = back.metadata().get_bin("escher-evicted-bin").unwrap();
        assert_eq!(bytes.to_bytes().unwrap().as_ref(), &[0, 1, 2, 255]);
        // A code no status has reads as UNKNOWN, and a bad entry is left out.
        let odd = wire::CallError {
            code: 999,
            message: "odd".into(),
            metadata: [("bad key".to_string(), b"x".to_vec())].into(),
        };
        let odd = tonic::Status::from(odd);
        assert_eq!(odd.code(), tonic::Code::Unknown);
        assert!(odd.metadata().is_empty());
    }
}
