//! Conversions of the `WorkerLink` messages: registration, and the two directions of a
//! worker's stream.

use super::cluster::{namespace, namespace_to_wire};
use super::gpu::{gpu_list, hold_list};
use super::object_id;
use super::status::{log_stream, log_stream_to_wire};
use super::{
    At, ConvertError, MAX_ADDRESS_BYTES, MAX_METRICS, MAX_NAME_BYTES, Problem, check_len,
    check_name, check_printable, convert_list, convert_required, duration_to_ms, ms_to_duration,
    non_empty, required,
};
use crate::types::{
    Assignment, DroppedHeld, HeadMessage, HeldCopy, Labels, LogChunk, MAX_HELD_BATCH, Metric,
    MigDone, NodeId, NodeIdentity, OUTPUT_TAIL_BYTES, OutputTail, RegisterReply, RegisterRequest,
    ResourceSet, RunningTask, TaskFinished, TaskId, TaskResult, TaskSpec, WorkerMessage,
};
use crate::wire;
use crate::wire::{head_message, task_finished, worker_message};

/// What an empty error text becomes when sent, so that it still reads as a failure.
const UNKNOWN_ERROR: &str = "unknown error";

/// The most object arguments one `Assign` locates: more than a 256-byte
/// [`OBJECTS_LABEL`](crate::types::OBJECTS_LABEL) can name (an id and its `+` take at least
/// 4 bytes).
pub const MAX_ASSIGNED_OBJECTS: usize = 128;

impl From<RegisterRequest> for wire::RegisterRequest {
    fn from(r: RegisterRequest) -> Self {
        wire::RegisterRequest {
            name: r.name,
            address: r.address,
            resources: r.resources.into(),
            labels: r.labels.into(),
            running: r
                .running
                .into_iter()
                .map(|t| wire::RunningTask {
                    task_id: t.task_id.0,
                    attempt: t.attempt,
                })
                .collect(),
            gpus: r.gpus.into_iter().map(Into::into).collect(),
            finished: r.finished.into_iter().map(Into::into).collect(),
            identity: r.identity.map(|i| wire::NodeIdentity {
                node_id: i.node_id.0,
                secret: i.secret,
                group: i.group,
            }),
            boot_id: r.boot_id,
        }
    }
}

impl TryFrom<wire::RegisterRequest> for RegisterRequest {
    type Error = ConvertError;
    fn try_from(w: wire::RegisterRequest) -> Result<Self, ConvertError> {
        check_name("name", &w.name, MAX_NAME_BYTES)?;
        check_printable("name", &w.name)?;
        check_len("address", &w.address, MAX_ADDRESS_BYTES)?;
        Ok(RegisterRequest {
            name: w.name,
            address: w.address,
            resources: ResourceSet::try_from(w.resources).at("resources")?,
            labels: Labels::try_from(w.labels).at("labels")?,
            running: w
                .running
                .into_iter()
                .map(|t| RunningTask {
                    task_id: TaskId(t.task_id),
                    attempt: t.attempt,
                })
                .collect(),
            gpus: gpu_list(w.gpus, "gpus")?,
            finished: convert_list(w.finished, "finished", MAX_REPORTS, |f| {
                TaskFinished::try_from(f)
            })?,
            identity: w.identity.map(identity).transpose().at("identity")?,
            boot_id: w.boot_id,
        })
    }
}

/// The most unacknowledged task reports one registration carries.
pub const MAX_REPORTS: usize = 1_000_000;
/// The longest node secret, in bytes.
const MAX_SECRET_BYTES: usize = 256;

/// The longest `Heartbeat.fence`.
const MAX_FENCE_BYTES: usize = 1024;
/// The most actor incarnations one heartbeat names (`Heartbeat.actors`).
const MAX_ACTOR_LOADS: usize = 4096;

fn identity(w: wire::NodeIdentity) -> Result<NodeIdentity, ConvertError> {
    if w.node_id == 0 {
        return Err(ConvertError::new("node_id", Problem::Rule("must not be 0")));
    }
    check_name("secret", &w.secret, MAX_SECRET_BYTES)?;
    check_name("group", &w.group, MAX_NAME_BYTES)?;
    Ok(NodeIdentity {
        node_id: NodeId(w.node_id),
        secret: w.secret,
        group: w.group,
    })
}

impl From<RegisterReply> for wire::RegisterReply {
    fn from(r: RegisterReply) -> Self {
        wire::RegisterReply {
            node_id: r.node_id.0,
            heartbeat_interval_ms: duration_to_ms(r.heartbeat_interval),
            secret: r.secret,
            group: r.group,
            heartbeat_timeout_ms: r.heartbeat_timeout.map_or(0, duration_to_ms),
            incarnation: r.incarnation,
        }
    }
}

impl TryFrom<wire::RegisterReply> for RegisterReply {
    type Error = ConvertError;
    fn try_from(w: wire::RegisterReply) -> Result<Self, ConvertError> {
        if w.heartbeat_interval_ms == 0 {
            let why = Problem::Rule("must be at least 1 ms");
            return Err(ConvertError::new("heartbeat_interval_ms", why));
        }
        if w.node_id == 0 {
            return Err(ConvertError::new("node_id", Problem::Rule("must not be 0")));
        }
        if let Some(secret) = &w.secret {
            check_name("secret", secret, MAX_SECRET_BYTES)?;
        }
        check_name("group", &w.group, MAX_NAME_BYTES)?;
        Ok(RegisterReply {
            node_id: NodeId(w.node_id),
            heartbeat_interval: ms_to_duration(w.heartbeat_interval_ms),
            heartbeat_timeout: (w.heartbeat_timeout_ms > 0)
                .then(|| ms_to_duration(w.heartbeat_timeout_ms)),
            secret: w.secret,
            group: w.group,
            incarnation: w.incarnation,
        })
    }
}

fn metric(w: wire::Metric) -> Result<Metric, ConvertError> {
    check_name("name", &w.name, MAX_NAME_BYTES)?;
    if !w.value.is_finite() {
        return Err(ConvertError::new(
            "value",
            Problem::Rule("must be a finite number"),
        ));
    }
    Ok(Metric {
        name: w.name,
        value: w.value,
    })
}

impl From<WorkerMessage> for wire::WorkerMessage {
    fn from(m: WorkerMessage) -> Self {
        use worker_message::Body;
        let body = match m {
            WorkerMessage::Hello {
                node_id,
                secret,
                interned_names,
            } => Body::Hello(wire::Hello {
                node_id: node_id.0,
                secret,
                interned_names,
            }),
            WorkerMessage::Heartbeat {
                metrics,
                seq,
                fence,
                actors,
            } => Body::Heartbeat(wire::Heartbeat {
                seq,
                fence: fence.unwrap_or_default(),
                actors: actors
                    .into_iter()
                    .map(|a| wire::ActorLoad {
                        actor: a.actor.0,
                        incarnation: a.incarnation,
                        pending: a.pending,
                    })
                    .collect(),
                metrics: metrics
                    .into_iter()
                    .map(|m| wire::Metric {
                        name: m.name,
                        value: m.value,
                    })
                    .collect(),
            }),
            WorkerMessage::TaskStarted { task_id, attempt } => {
                Body::TaskStarted(wire::TaskStarted {
                    task_id: task_id.0,
                    attempt,
                })
            }
            WorkerMessage::TaskFinished(f) => Body::TaskFinished(f.into()),
            WorkerMessage::Logs { request_id, result } => Body::LogChunk(match result {
                Ok(c) => wire::LogChunk {
                    request_id,
                    data: c.data,
                    next_offset: c.next_offset,
                    eof: c.eof,
                    error: String::new(),
                },
                Err(e) => wire::LogChunk {
                    request_id,
                    error: non_empty(e).unwrap_or_else(|| UNKNOWN_ERROR.to_string()),
                    ..Default::default()
                },
            }),
            WorkerMessage::TaskDevices {
                task_id,
                attempt,
                devices,
            } => Body::TaskDevices(wire::TaskDevices {
                task_id: task_id.0,
                attempt,
                devices: devices.into_iter().map(Into::into).collect(),
            }),
            WorkerMessage::GpusChanged { gpus, done } => Body::GpusChanged(wire::GpusChanged {
                gpus: gpus.into_iter().map(Into::into).collect(),
                done: done.map(|d| wire::MigDone {
                    gpu: d.gpu,
                    // An empty reason still reads as a failure.
                    error: d
                        .error
                        .map(|e| non_empty(e).unwrap_or_else(|| UNKNOWN_ERROR.into())),
                    phases: Some((*d.phases).into()),
                }),
            }),
            WorkerMessage::ObjectsHeld(copies) => Body::ObjectsHeld(wire::ObjectsHeld {
                copies: copies
                    .into_iter()
                    .map(|c| wire::HeldObject {
                        id: Some(c.id.into()),
                        size: c.size,
                        crc32c: c.checksum,
                        namespace: namespace_to_wire(c.namespace),
                        copy: c.copy,
                    })
                    .collect(),
            }),
        };
        wire::WorkerMessage { body: Some(body) }
    }
}

impl TryFrom<wire::WorkerMessage> for WorkerMessage {
    type Error = ConvertError;
    fn try_from(w: wire::WorkerMessage) -> Result<Self, ConvertError> {
        use worker_message::Body;
        Ok(match required(w.body, "body")? {
            Body::Hello(h) => {
                check_len("hello.secret", &h.secret, MAX_SECRET_BYTES)?;
                WorkerMessage::Hello {
                    node_id: NodeId(h.node_id),
                    secret: h.secret,
                    interned_names: h.interned_names,
                }
            }
            Body::Heartbeat(h) => {
                check_len("fence", &h.fence, MAX_FENCE_BYTES).at("heartbeat")?;
                WorkerMessage::Heartbeat {
                    metrics: convert_list(h.metrics, "metrics", MAX_METRICS, metric)
                        .at("heartbeat")?,
                    seq: h.seq,
                    fence: Some(h.fence).filter(|f| !f.is_empty()),
                    actors: convert_list(h.actors, "actors", MAX_ACTOR_LOADS, |a| {
                        Ok(crate::types::ActorLoad {
                            actor: TaskId(a.actor),
                            incarnation: a.incarnation,
                            pending: a.pending,
                        })
                    })
                    .at("heartbeat")?,
                }
            }
            Body::TaskStarted(s) => WorkerMessage::TaskStarted {
                task_id: TaskId(s.task_id),
                attempt: s.attempt,
            },
            Body::TaskFinished(f) => {
                WorkerMessage::TaskFinished(TaskFinished::try_from(f).at("task_finished")?)
            }
            Body::LogChunk(c) => WorkerMessage::Logs {
                request_id: c.request_id,
                result: match non_empty(c.error) {
                    Some(e) => Err(e),
                    None => Ok(LogChunk {
                        data: c.data,
                        next_offset: c.next_offset,
                        eof: c.eof,
                        ..LogChunk::default()
                    }),
                },
            },
            Body::TaskDevices(d) => WorkerMessage::TaskDevices {
                task_id: TaskId(d.task_id),
                attempt: d.attempt,
                devices: hold_list(d.devices, "devices").at("task_devices")?,
            },
            Body::GpusChanged(g) => WorkerMessage::GpusChanged {
                gpus: gpu_list(g.gpus, "gpus").at("gpus_changed")?,
                done: g.done.map(|d| MigDone {
                    gpu: d.gpu,
                    error: d.error,
                    phases: Box::new(d.phases.map(Into::into).unwrap_or_default()),
                }),
            },
            Body::ObjectsHeld(h) => WorkerMessage::ObjectsHeld(
                convert_list(h.copies, "copies", MAX_HELD_BATCH, |c| {
                    Ok(HeldCopy {
                        id: object_id(c.id, "id")?,
                        size: c.size,
                        checksum: c.crc32c,
                        namespace: namespace(c.namespace)?,
                        copy: c.copy,
                    })
                })
                .at("objects_held")?,
            ),
        })
    }
}

impl From<TaskFinished> for wire::TaskFinished {
    fn from(f: TaskFinished) -> Self {
        use task_finished::Outcome;
        let outcome = match f.outcome {
            Ok(TaskResult::Exited { code }) => Outcome::ExitCode(code),
            Ok(TaskResult::Returned(bytes)) => Outcome::Returned(bytes),
            Ok(TaskResult::Released) => Outcome::Released(wire::Released {}),
            Ok(TaskResult::OutOfMemory {
                used_mib,
                limit_mib,
            }) => Outcome::OutOfMemory(wire::OutOfMemory {
                used_mib,
                limit_mib,
            }),
            Ok(TaskResult::Object { size, checksum }) => {
                Outcome::Object(wire::ResultObject { size, checksum })
            }
            Err(e) => Outcome::Error(e),
        };
        wire::TaskFinished {
            task_id: f.task_id.0,
            attempt: f.attempt,
            outcome: Some(outcome),
            timed_out: f.timed_out,
            output: f.output.map(|o| wire::OutputTail {
                stdout: o.stdout,
                stderr: o.stderr,
                stdout_len: o.stdout_len,
                stderr_len: o.stderr_len,
            }),
        }
    }
}

impl TryFrom<wire::TaskFinished> for TaskFinished {
    type Error = ConvertError;
    fn try_from(w: wire::TaskFinished) -> Result<Self, ConvertError> {
        use task_finished::Outcome;
        let outcome = match required(w.outcome, "outcome")? {
            Outcome::ExitCode(code) => Ok(TaskResult::Exited { code }),
            Outcome::Returned(bytes) => Ok(TaskResult::Returned(super::kept(bytes))),
            Outcome::Released(wire::Released {}) => Ok(TaskResult::Released),
            Outcome::OutOfMemory(w) => Ok(TaskResult::OutOfMemory {
                used_mib: w.used_mib,
                limit_mib: w.limit_mib,
            }),
            Outcome::Object(w) => Ok(TaskResult::Object {
                size: w.size,
                checksum: w.checksum,
            }),
            Outcome::Error(e) => Err(e),
        };
        let output = match w.output {
            Some(o) => {
                for (field, tail, len) in [
                    ("output.stdout", &o.stdout, o.stdout_len),
                    ("output.stderr", &o.stderr, o.stderr_len),
                ] {
                    if tail.len() > OUTPUT_TAIL_BYTES {
                        let too_long = Problem::TooLong {
                            len: tail.len(),
                            max: OUTPUT_TAIL_BYTES,
                        };
                        return Err(ConvertError::new(field, too_long));
                    }
                    if tail.len() as u64 > len {
                        let why = "the tail is longer than the whole stream";
                        return Err(ConvertError::new(field, Problem::Rule(why)));
                    }
                }
                Some(OutputTail {
                    stdout: o.stdout,
                    stderr: o.stderr,
                    stdout_len: o.stdout_len,
                    stderr_len: o.stderr_len,
                })
            }
            None => None,
        };
        Ok(TaskFinished {
            task_id: TaskId(w.task_id),
            attempt: w.attempt,
            outcome,
            timed_out: w.timed_out,
            output,
        })
    }
}

impl From<HeadMessage> for wire::HeadMessage {
    fn from(m: HeadMessage) -> Self {
        use head_message::Body;
        let body = match m {
            HeadMessage::Assign(a) => {
                // The allocation travels only where it differs from the request (never, today):
                // every name once per task, not twice.
                let allocation = if a.allocation == a.spec.resources {
                    Vec::new()
                } else {
                    a.allocation.into()
                };
                Body::Assign(wire::Assign {
                    task_id: a.task_id.0,
                    attempt: a.attempt,
                    spec: Some(a.spec.into()),
                    allocation,
                    task_token: a.task_token,
                    objects: a.objects.into_iter().map(Into::into).collect(),
                    ..Default::default()
                })
            }
            HeadMessage::CancelTask {
                task_id,
                attempt,
                reason,
                force,
            } => Body::CancelTask(wire::CancelTask {
                task_id: task_id.0,
                attempt,
                reason,
                force,
            }),
            HeadMessage::FetchLogs {
                request_id,
                task_id,
                stream,
                offset,
                max_bytes,
                attempt,
            } => Body::FetchLogs(wire::FetchLogs {
                request_id,
                task_id: task_id.0,
                stream: log_stream_to_wire(stream),
                offset,
                max_bytes,
                attempt,
            }),
            HeadMessage::Shutdown { reason } => Body::Shutdown(wire::Shutdown { reason }),
            HeadMessage::ReconfigureMig { gpu, layout } => {
                Body::ReconfigureMig(wire::ReconfigureMig { gpu, layout })
            }
            HeadMessage::ReportsAcked(reports) => Body::ReportsAcked(wire::ReportsAcked {
                reports: reports
                    .into_iter()
                    .map(|r| wire::RunningTask {
                        task_id: r.task_id.0,
                        attempt: r.attempt,
                    })
                    .collect(),
            }),
            HeadMessage::LeaseRenewed { seq } => Body::LeaseRenewed(wire::LeaseRenewed { seq }),
            HeadMessage::DeleteObjects(ids) => Body::DeleteObjects(wire::DeleteObjects {
                ids: ids.into_iter().map(Into::into).collect(),
            }),
            HeadMessage::DropCopies(copies) => Body::DropCopies(wire::DropCopies {
                copies: copies
                    .into_iter()
                    .map(|d| wire::DroppedHeld {
                        id: Some(d.id.into()),
                        copy: d.copy,
                        reason: d.reason,
                    })
                    .collect(),
            }),
        };
        wire::HeadMessage { body: Some(body) }
    }
}

impl TryFrom<wire::HeadMessage> for HeadMessage {
    type Error = ConvertError;
    fn try_from(w: wire::HeadMessage) -> Result<Self, ConvertError> {
        use head_message::Body;
        Ok(match required(w.body, "body")? {
            Body::Assign(a) => HeadMessage::Assign(assignment(a).at("assign")?),
            Body::CancelTask(c) => HeadMessage::CancelTask {
                task_id: TaskId(c.task_id),
                attempt: c.attempt,
                reason: c.reason,
                force: c.force,
            },
            Body::FetchLogs(f) => HeadMessage::FetchLogs {
                request_id: f.request_id,
                task_id: TaskId(f.task_id),
                stream: log_stream(f.stream, "fetch_logs.stream")?,
                offset: f.offset,
                max_bytes: f.max_bytes,
                attempt: f.attempt,
            },
            Body::Shutdown(s) => HeadMessage::Shutdown { reason: s.reason },
            Body::ReconfigureMig(r) => {
                check_len("reconfigure_mig.layout", &r.layout, super::MAX_LAYOUT_BYTES)?;
                HeadMessage::ReconfigureMig {
                    gpu: r.gpu,
                    layout: r.layout,
                }
            }
            Body::ReportsAcked(a) => HeadMessage::ReportsAcked(
                a.reports
                    .into_iter()
                    .map(|r| RunningTask {
                        task_id: TaskId(r.task_id),
                        attempt: r.attempt,
                    })
                    .collect(),
            ),
            Body::LeaseRenewed(l) => HeadMessage::LeaseRenewed { seq: l.seq },
            Body::DeleteObjects(d) => {
                HeadMessage::DeleteObjects(super::object_ids(d.ids, "delete_objects.ids")?)
            }
            Body::DropCopies(d) => HeadMessage::DropCopies(
                convert_list(d.copies, "copies", MAX_HELD_BATCH, |c| {
                    Ok(DroppedHeld {
                        id: object_id(c.id, "id")?,
                        copy: c.copy,
                        reason: c.reason,
                    })
                })
                .at("drop_copies")?,
            ),
        })
    }
}

fn assignment(a: wire::Assign) -> Result<Assignment, ConvertError> {
    let spec: TaskSpec = convert_required(a.spec, "spec")?;
    let allocation = if a.allocation.is_empty() {
        spec.resources.clone()
    } else {
        ResourceSet::try_from(a.allocation).at("allocation")?
    };
    let objects = convert_list(
        a.objects,
        "objects",
        MAX_ASSIGNED_OBJECTS,
        TryFrom::try_from,
    )?;
    Ok(Assignment {
        task_id: TaskId(a.task_id),
        attempt: a.attempt,
        spec,
        allocation,
        task_token: a.task_token,
        objects,
    })
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;
    use crate::convert::testutil::{located, round_trip, sample_specs, set};
    use crate::types::LogStream;

    #[test]
    fn registration_round_trips_and_validates() {
        let req = RegisterRequest {
            name: "gpu-box-1".into(),
            address: "10.0.0.9:7601".into(),
            resources: set("cpu=64,memory=262144,mig.1g.10gb=7"),
            labels: "zone=a".parse().unwrap(),
            running: vec![RunningTask {
                task_id: TaskId(10),
                attempt: 2,
            }],
            gpus: vec![crate::types::GpuInfo {
                index: 0,
                uuid: "GPU-1".into(),
                product: "NVIDIA H100 80GB HBM3".into(),
                model: None,
                memory_mib: 81559,
                mig_enabled: false,
                simulated: false,
                slices: vec![],
            }],
            finished: vec![TaskFinished {
                task_id: TaskId(9),
                attempt: 1,
                outcome: Ok(TaskResult::Exited { code: 0 }),
                timed_out: false,
                output: None,
            }],
            identity: Some(NodeIdentity {
                node_id: NodeId(3),
                secret: "c0ffee".into(),
                group: "g-1".into(),
            }),
            boot_id: 77,
        };
        let w = round_trip::<_, wire::RegisterRequest>(req);
        let mut zero_id = w.clone();
        zero_id.identity.as_mut().unwrap().node_id = 0;
        assert_eq!(
            RegisterRequest::try_from(zero_id).unwrap_err().path(),
            "identity.node_id"
        );
        let e = RegisterRequest::try_from(wire::RegisterRequest {
            name: String::new(),
            ..w.clone()
        });
        assert_eq!(e.unwrap_err().to_string(), "name: must not be empty");
        let mut bad = w;
        bad.resources[0].amount = u64::MAX;
        assert_eq!(
            RegisterRequest::try_from(bad).unwrap_err().path(),
            r#"resources["cpu"]"#
        );
        let reply = RegisterReply {
            node_id: NodeId(3),
            heartbeat_interval: Duration::from_secs(1),
            heartbeat_timeout: Some(Duration::from_secs(10)),
            secret: Some("s3cret".into()),
            group: "g-1".into(),
            incarnation: 1_600_000_035,
        };
        round_trip::<_, wire::RegisterReply>(reply);
        let zero = wire::RegisterReply {
            node_id: 1,
            heartbeat_interval_ms: 0,
            secret: None,
            group: "g".into(),
            heartbeat_timeout_ms: 0,
            incarnation: 0,
        };
        assert_eq!(
            RegisterReply::try_from(zero).unwrap_err().path(),
            "heartbeat_interval_ms"
        );
    }

    #[test]
    fn every_worker_message_round_trips() {
        let finished = |outcome| {
            WorkerMessage::TaskFinished(TaskFinished {
                task_id: TaskId(1),
                attempt: 1,
                outcome,
                timed_out: false,
                output: None,
            })
        };
        let messages = vec![
            WorkerMessage::Hello {
                node_id: NodeId(7),
                secret: "s".into(),
                interned_names: true,
            },
            WorkerMessage::Heartbeat {
                metrics: vec![],
                seq: 0,
                fence: None,
                actors: vec![],
            },
            WorkerMessage::Heartbeat {
                seq: 9,
                fence: Some("restarted 1 time(s)".into()),
                actors: vec![crate::types::ActorLoad {
                    actor: TaskId(4),
                    incarnation: 2,
                    pending: 17,
                }],
                metrics: vec![Metric {
                    name: "load".into(),
                    value: 0.25,
                }],
            },
            WorkerMessage::TaskStarted {
                task_id: TaskId(1),
                attempt: 3,
            },
            finished(Ok(TaskResult::Exited { code: -1 })),
            finished(Ok(TaskResult::Returned(vec![1, 2, 3].into()))),
            finished(Ok(TaskResult::Released)),
            finished(Err("no such function \"f\"".into())),
            WorkerMessage::TaskFinished(TaskFinished {
                task_id: TaskId(2),
                attempt: 1,
                outcome: Ok(TaskResult::Exited { code: 137 }),
                timed_out: true,
                output: Some(OutputTail {
                    stdout: b"done\n".to_vec(),
                    stderr: Vec::new(),
                    stdout_len: 9000,
                    stderr_len: 0,
                }),
            }),
            WorkerMessage::Logs {
                request_id: 5,
                result: Ok(LogChunk {
                    data: b"out".to_vec(),
                    next_offset: 3,
                    eof: false,
                    ..LogChunk::default()
                }),
            },
            WorkerMessage::Logs {
                request_id: 6,
                result: Err("no such task".into()),
            },
            WorkerMessage::TaskDevices {
                task_id: TaskId(4),
                attempt: 1,
                devices: vec![crate::types::DeviceHold {
                    uuid: "MIG-41d0c7e2".into(),
                    amount: crate::Amount::ONE,
                }],
            },
            WorkerMessage::GpusChanged {
                gpus: vec![],
                done: None,
            },
            WorkerMessage::ObjectsHeld(vec![
                HeldCopy {
                    id: crate::types::ObjectId(1 << 63, 4),
                    size: 200_000,
                    checksum: 0xdead_beef,
                    namespace: Some(crate::types::Namespace::new("team").unwrap()),
                    copy: 9,
                },
                HeldCopy {
                    id: crate::types::ObjectId(12, 0),
                    size: 1,
                    checksum: 0,
                    namespace: None,
                    copy: 10,
                },
            ]),
            WorkerMessage::GpusChanged {
                gpus: vec![],
                done: Some(MigDone {
                    gpu: 2,
                    error: Some("in use".into()),
                    phases: Default::default(),
                }),
            },
            WorkerMessage::GpusChanged {
                gpus: vec![],
                done: Some(MigDone {
                    gpu: 0,
                    error: None,
                    phases: Box::new(
                        crate::mig::LatencyModel::default().cost(
                            &crate::mig::Layout::parse(crate::mig::GpuModel::A100_40GB, "7g.40gb")
                                .unwrap(),
                            &crate::mig::Layout::new(crate::mig::GpuModel::A100_40GB),
                        ),
                    ),
                }),
            },
        ];
        for m in messages {
            round_trip::<_, wire::WorkerMessage>(m);
        }
        // An empty error text still arrives as an error.
        let m = WorkerMessage::Logs {
            request_id: 1,
            result: Err(String::new()),
        };
        let back = WorkerMessage::try_from(wire::WorkerMessage::from(m)).unwrap();
        assert!(matches!(back, WorkerMessage::Logs { result: Err(e), .. } if e == UNKNOWN_ERROR));
    }

    #[test]
    fn worker_message_errors() {
        let e = WorkerMessage::try_from(wire::WorkerMessage { body: None }).unwrap_err();
        assert_eq!(e.to_string(), "missing field body");
        let f = wire::TaskFinished {
            task_id: 1,
            attempt: 1,
            outcome: None,
            timed_out: false,
            output: None,
        };
        let w = wire::WorkerMessage {
            body: Some(worker_message::Body::TaskFinished(f.clone())),
        };
        let e = WorkerMessage::try_from(w).unwrap_err();
        assert_eq!(e.to_string(), "missing field task_finished.outcome");
        for (tail, len, why) in [
            (
                vec![b'x'; OUTPUT_TAIL_BYTES + 1],
                1 << 20,
                "longer than the limit",
            ),
            (b"abc".to_vec(), 2, "longer than the whole stream"),
        ] {
            let f = wire::TaskFinished {
                outcome: Some(task_finished::Outcome::ExitCode(0)),
                output: Some(wire::OutputTail {
                    stderr: tail,
                    stderr_len: len,
                    ..Default::default()
                }),
                ..f.clone()
            };
            let w = wire::WorkerMessage {
                body: Some(worker_message::Body::TaskFinished(f)),
            };
            let e = WorkerMessage::try_from(w).unwrap_err().to_string();
            assert!(e.starts_with("task_finished.output.stderr: "), "{e}");
            assert!(e.contains(why), "{e}");
        }
        let metrics = vec![
            wire::Metric {
                name: "x".into(),
                value: 1.0,
            },
            wire::Metric {
                name: "load".into(),
                value: f64::NAN,
            },
        ];
        let w = wire::WorkerMessage {
            body: Some(worker_message::Body::Heartbeat(wire::Heartbeat {
                metrics,
                seq: 1,
                fence: String::new(),
                actors: Vec::new(),
            })),
        };
        assert_eq!(
            WorkerMessage::try_from(w).unwrap_err().path(),
            "heartbeat.metrics[1].value"
        );
        let w = wire::WorkerMessage {
            body: Some(worker_message::Body::Heartbeat(wire::Heartbeat {
                metrics: Vec::new(),
                seq: 1,
                fence: "x".repeat(MAX_FENCE_BYTES + 1),
                actors: Vec::new(),
            })),
        };
        assert_eq!(
            WorkerMessage::try_from(w).unwrap_err().path(),
            "heartbeat.fence"
        );
    }

    #[test]
    fn every_head_message_round_trips() {
        let mut messages: Vec<HeadMessage> = sample_specs()
            .into_iter()
            .enumerate()
            .map(|(i, spec)| {
                HeadMessage::Assign(Assignment {
                    task_id: TaskId(i as u64),
                    attempt: 1,
                    allocation: spec.resources.clone(),
                    spec,
                    task_token: format!("escher-task-{i}"),
                    objects: Vec::new(),
                })
            })
            .collect();
        messages.extend([
            HeadMessage::CancelTask {
                task_id: TaskId(1),
                attempt: 2,
                reason: "user".into(),
                force: false,
            },
            HeadMessage::CancelTask {
                task_id: TaskId(1),
                attempt: 3,
                reason: "user".into(),
                force: true,
            },
            HeadMessage::FetchLogs {
                request_id: 9,
                task_id: TaskId(1),
                stream: LogStream::Stdout,
                offset: 0,
                max_bytes: 65536,
                attempt: 2,
            },
            HeadMessage::Shutdown {
                reason: "head stopping".into(),
            },
            HeadMessage::ReconfigureMig {
                gpu: 0,
                layout: "4g.20gb@0,3g.20gb@4".into(),
            },
            HeadMessage::LeaseRenewed { seq: 41 },
            HeadMessage::DeleteObjects(vec![crate::types::ObjectId(1 << 63, 2)]),
            HeadMessage::DropCopies(vec![DroppedHeld {
                id: crate::types::ObjectId(7, 0),
                copy: 3,
                reason: "object 7.0 was freed".into(),
            }]),
        ]);
        let mut spec = sample_specs().remove(0);
        spec.resources = set("cpu=1,mig.1g.5gb=1");
        messages.push(HeadMessage::Assign(Assignment {
            task_id: TaskId(99),
            attempt: 1,
            allocation: set("cpu=1,mig.1g.5gb=1,mig.MIG-0000=1"),
            spec,
            task_token: String::new(),
            objects: vec![located(7)],
        }));
        for m in messages {
            round_trip::<_, wire::HeadMessage>(m);
        }
    }

    #[test]
    fn an_allocation_equal_to_the_request_is_not_sent_twice() {
        let spec = sample_specs().remove(0);
        assert!(!spec.resources.is_empty());
        let message = HeadMessage::Assign(Assignment {
            task_id: TaskId(1),
            attempt: 1,
            allocation: spec.resources.clone(),
            spec,
            task_token: String::new(),
            objects: Vec::new(),
        });
        let wire = wire::HeadMessage::from(message);
        let Some(head_message::Body::Assign(assign)) = &wire.body else {
            panic!("an assign");
        };
        assert!(assign.allocation.is_empty());
    }

    #[test]
    fn head_message_errors() {
        let e = HeadMessage::try_from(wire::HeadMessage { body: None }).unwrap_err();
        assert_eq!(e.to_string(), "missing field body");
        let assign = |spec| wire::HeadMessage {
            body: Some(head_message::Body::Assign(wire::Assign {
                task_id: 1,
                attempt: 1,
                spec,
                allocation: vec![],
                task_token: String::new(),
                ..Default::default()
            })),
        };
        let e = HeadMessage::try_from(assign(None)).unwrap_err();
        assert_eq!(e.to_string(), "missing field assign.spec");
        let e = HeadMessage::try_from(assign(Some(wire::TaskSpec::default()))).unwrap_err();
        assert_eq!(e.to_string(), "missing field assign.spec.kind");
        // A located argument without its id, and more than any label names.
        let spec = wire::TaskSpec::from(sample_specs().remove(0));
        let with_objects = |objects: Vec<wire::ObjectInfo>| {
            let mut msg = assign(Some(spec.clone()));
            if let Some(head_message::Body::Assign(a)) = &mut msg.body {
                a.objects = objects;
            }
            msg
        };
        let mut no_id = wire::ObjectInfo::from(located(1));
        no_id.id = None;
        let e = HeadMessage::try_from(with_objects(vec![no_id])).unwrap_err();
        assert_eq!(e.path(), "assign.objects[0].id", "{e}");
        let many = vec![wire::ObjectInfo::from(located(1)); MAX_ASSIGNED_OBJECTS + 1];
        let e = HeadMessage::try_from(with_objects(many)).unwrap_err();
        assert_eq!(e.path(), "assign.objects", "{e}");
        let fetch = wire::FetchLogs {
            stream: 7,
            ..Default::default()
        };
        let w = wire::HeadMessage {
            body: Some(head_message::Body::FetchLogs(fetch)),
        };
        assert_eq!(
            HeadMessage::try_from(w).unwrap_err().path(),
            "fetch_logs.stream"
        );
    }
}
