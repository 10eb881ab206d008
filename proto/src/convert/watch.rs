//! The `Watch` call: its request and the batches of events it streams.

use super::cluster::{label_selector, namespace, namespace_to_wire, selectors_to_wire};
use super::task::{task_state, task_state_to_wire};
use super::{
    At, ConvertError, MAX_NAME_BYTES, Problem, check_len, convert_list, convert_optional, required,
};
use crate::types::{
    ActorChange, ClusterEvent, MAX_ACTOR_NAME_BYTES, MAX_DECISION_REASON, MAX_LABEL_SELECTORS,
    MAX_POLICY_NAME, MAX_WATCH_TASKS, NodeChange, NodeId, ResourceName, TaskId, WatchBatch,
    WatchEvent, WatchKind, WatchRequest,
};
use crate::wire::{self, watch_event::Event as W};

/// The longest reason an event carries, in bytes (longer ones are cut by the head).
const MAX_REASON_BYTES: usize = 64 * 1024;

impl From<WatchKind> for wire::WatchKind {
    fn from(k: WatchKind) -> Self {
        match k {
            WatchKind::Submitted => wire::WatchKind::Submitted,
            WatchKind::Started => wire::WatchKind::Started,
            WatchKind::Finished => wire::WatchKind::Finished,
            WatchKind::Pending => wire::WatchKind::Pending,
            WatchKind::Resource => wire::WatchKind::Resource,
            WatchKind::Node => wire::WatchKind::Node,
            WatchKind::Reservation => wire::WatchKind::Reservation,
            WatchKind::Actor => wire::WatchKind::Actor,
            WatchKind::Decision => wire::WatchKind::Decision,
        }
    }
}

fn watch_kind(value: i32) -> Result<WatchKind, ConvertError> {
    let unknown = || {
        let expected =
            "SUBMITTED, STARTED, FINISHED, PENDING, RESOURCE, NODE, RESERVATION, ACTOR, DECISION";
        ConvertError::new("", Problem::UnknownEnum { value, expected })
    };
    Ok(
        match wire::WatchKind::try_from(value).map_err(|_| unknown())? {
            wire::WatchKind::Unspecified => return Err(unknown()),
            wire::WatchKind::Submitted => WatchKind::Submitted,
            wire::WatchKind::Started => WatchKind::Started,
            wire::WatchKind::Finished => WatchKind::Finished,
            wire::WatchKind::Pending => WatchKind::Pending,
            wire::WatchKind::Resource => WatchKind::Resource,
            wire::WatchKind::Node => WatchKind::Node,
            wire::WatchKind::Reservation => WatchKind::Reservation,
            wire::WatchKind::Actor => WatchKind::Actor,
            wire::WatchKind::Decision => WatchKind::Decision,
        },
    )
}

impl From<WatchRequest> for wire::WatchRequest {
    fn from(r: WatchRequest) -> Self {
        wire::WatchRequest {
            after_revision: r.after,
            namespace: namespace_to_wire(r.namespace),
            task_ids: r.tasks.into_iter().map(|t| t.0).collect(),
            labels: selectors_to_wire(r.labels),
            kinds: r
                .kinds
                .into_iter()
                .map(|k| wire::WatchKind::from(k).into())
                .collect(),
        }
    }
}

impl TryFrom<wire::WatchRequest> for WatchRequest {
    type Error = ConvertError;
    fn try_from(w: wire::WatchRequest) -> Result<Self, ConvertError> {
        let mut kinds = convert_list(w.kinds, "kinds", WatchKind::ALL.len() * 4, watch_kind)?;
        kinds.sort_unstable();
        kinds.dedup();
        Ok(WatchRequest {
            after: w.after_revision,
            namespace: namespace(w.namespace)?,
            tasks: convert_list(w.task_ids, "task_ids", MAX_WATCH_TASKS, |t| Ok(TaskId(t)))?,
            labels: convert_list(w.labels, "labels", MAX_LABEL_SELECTORS, label_selector)?,
            kinds,
        })
    }
}

impl From<NodeChange> for wire::NodeChange {
    fn from(c: NodeChange) -> Self {
        match c {
            NodeChange::Joined => wire::NodeChange::Joined,
            NodeChange::Rejoined => wire::NodeChange::Rejoined,
            NodeChange::Draining => wire::NodeChange::Draining,
            NodeChange::Lost => wire::NodeChange::Lost,
            NodeChange::Labelled => wire::NodeChange::Labelled,
        }
    }
}

fn node_change(value: i32) -> Result<NodeChange, ConvertError> {
    let unknown = || {
        let expected = "JOINED, REJOINED, DRAINING, LOST, LABELLED";
        ConvertError::new("change", Problem::UnknownEnum { value, expected })
    };
    Ok(
        match wire::NodeChange::try_from(value).map_err(|_| unknown())? {
            wire::NodeChange::Unspecified => return Err(unknown()),
            wire::NodeChange::Joined => NodeChange::Joined,
            wire::NodeChange::Rejoined => NodeChange::Rejoined,
            wire::NodeChange::Draining => NodeChange::Draining,
            wire::NodeChange::Lost => NodeChange::Lost,
            wire::NodeChange::Labelled => NodeChange::Labelled,
        },
    )
}

impl From<ActorChange> for wire::ActorChange {
    fn from(c: ActorChange) -> Self {
        match c {
            ActorChange::Ready => wire::ActorChange::Ready,
            ActorChange::Restarting => wire::ActorChange::Restarting,
            ActorChange::Died => wire::ActorChange::Died,
        }
    }
}

fn actor_change(value: i32) -> Result<ActorChange, ConvertError> {
    let unknown = || {
        let expected = "READY, RESTARTING, DIED";
        ConvertError::new("change", Problem::UnknownEnum { value, expected })
    };
    Ok(
        match wire::ActorChange::try_from(value).map_err(|_| unknown())? {
            wire::ActorChange::Unspecified => return Err(unknown()),
            wire::ActorChange::Ready => ActorChange::Ready,
            wire::ActorChange::Restarting => ActorChange::Restarting,
            wire::ActorChange::Died => ActorChange::Died,
        },
    )
}

fn reason(text: Option<String>) -> Result<Option<String>, ConvertError> {
    if let Some(text) = &text {
        check_len("reason", text, MAX_REASON_BYTES)?;
    }
    Ok(text)
}

impl From<WatchEvent> for wire::WatchEvent {
    fn from(e: WatchEvent) -> Self {
        let event = match e.event {
            ClusterEvent::Submitted {
                task,
                name,
                namespace,
            } => W::Submitted(wire::TaskSubmittedEvent {
                task_id: task.0,
                name,
                namespace: namespace_to_wire(namespace),
            }),
            ClusterEvent::Started {
                task,
                node,
                attempt,
                namespace,
            } => W::Started(wire::TaskStartedEvent {
                task_id: task.0,
                node: node.0,
                attempt,
                namespace: namespace_to_wire(namespace),
            }),
            ClusterEvent::Finished {
                task,
                state,
                reason,
                attempt,
                namespace,
            } => W::Finished(wire::TaskFinishedEvent {
                task_id: task.0,
                state: task_state_to_wire(state),
                reason,
                attempt,
                namespace: namespace_to_wire(namespace),
            }),
            ClusterEvent::Pending {
                task,
                reason,
                namespace,
            } => W::Pending(wire::TaskPendingEvent {
                task_id: task.0,
                reason,
                namespace: namespace_to_wire(namespace),
            }),
            ClusterEvent::Resource {
                node,
                name,
                capacity,
            } => W::Resource(wire::ResourceChangedEvent {
                node: node.0,
                name: name.to_string(),
                capacity: capacity.map(Into::into),
            }),
            ClusterEvent::Node {
                node,
                name,
                change,
                reason,
            } => W::Node(wire::NodeChangedEvent {
                node: node.0,
                name,
                change: wire::NodeChange::from(change).into(),
                reason,
            }),
            ClusterEvent::Reservation { name, placed } => {
                W::Reservation(wire::ReservationChangedEvent {
                    name: name.to_string(),
                    task_id: placed.map(|(t, _)| t.0),
                    node: placed.map(|(_, n)| n.0),
                    released: placed.is_none(),
                })
            }
            ClusterEvent::Actor {
                actor,
                name,
                change,
                incarnation,
                node,
                reason,
                namespace,
            } => W::Actor(wire::ActorChangedEvent {
                actor_id: actor.0,
                name,
                change: wire::ActorChange::from(change).into(),
                incarnation,
                node: node.map(|n| n.0),
                reason,
                namespace: namespace_to_wire(namespace),
            }),
            ClusterEvent::Decision {
                source,
                action,
                reason,
            } => W::Decision(wire::DecisionEvent {
                source,
                action,
                reason,
            }),
        };
        wire::WatchEvent {
            revision: e.revision,
            at_ms: e.at_ms,
            event: Some(event),
        }
    }
}

fn resource_name(text: &str) -> Result<ResourceName, ConvertError> {
    ResourceName::new(text).at("name")
}

impl TryFrom<wire::WatchEvent> for WatchEvent {
    type Error = ConvertError;
    fn try_from(w: wire::WatchEvent) -> Result<Self, ConvertError> {
        let event = match required(w.event, "event")? {
            W::Submitted(e) => {
                check_len("name", &e.name, super::MAX_TASK_NAME_BYTES).at("submitted")?;
                ClusterEvent::Submitted {
                    task: TaskId(e.task_id),
                    name: e.name,
                    namespace: namespace(e.namespace).at("submitted")?,
                }
            }
            W::Started(e) => ClusterEvent::Started {
                task: TaskId(e.task_id),
                node: NodeId(e.node),
                attempt: e.attempt,
                namespace: namespace(e.namespace).at("started")?,
            },
            W::Finished(e) => ClusterEvent::Finished {
                task: TaskId(e.task_id),
                state: task_state(e.state, "finished.state")?,
                reason: reason(e.reason).at("finished")?,
                attempt: e.attempt,
                namespace: namespace(e.namespace).at("finished")?,
            },
            W::Pending(e) => ClusterEvent::Pending {
                task: TaskId(e.task_id),
                reason: reason(e.reason).at("pending")?,
                namespace: namespace(e.namespace).at("pending")?,
            },
            W::Resource(e) => ClusterEvent::Resource {
                node: NodeId(e.node),
                name: resource_name(&e.name).at("resource")?,
                capacity: convert_optional(e.capacity, "resource.capacity")?,
            },
            W::Node(e) => {
                check_len("name", &e.name, MAX_NAME_BYTES).at("node")?;
                ClusterEvent::Node {
                    node: NodeId(e.node),
                    name: e.name,
                    change: node_change(e.change).at("node")?,
                    reason: reason(e.reason).at("node")?,
                }
            }
            W::Reservation(e) => {
                let placed = match (e.released, e.task_id, e.node) {
                    (true, None, None) => None,
                    (false, Some(t), Some(n)) => Some((TaskId(t), NodeId(n))),
                    _ => {
                        let why = "a placed bundle names its task and node; a release neither";
                        return Err(ConvertError::new("reservation", Problem::Rule(why)));
                    }
                };
                ClusterEvent::Reservation {
                    name: resource_name(&e.name).at("reservation")?,
                    placed,
                }
            }
            W::Actor(e) => {
                if let Some(name) = &e.name {
                    check_len("name", name, MAX_ACTOR_NAME_BYTES).at("actor")?;
                }
                ClusterEvent::Actor {
                    actor: TaskId(e.actor_id),
                    name: e.name,
                    change: actor_change(e.change).at("actor")?,
                    incarnation: e.incarnation,
                    node: e.node.map(NodeId),
                    reason: reason(e.reason).at("actor")?,
                    namespace: namespace(e.namespace).at("actor")?,
                }
            }
            W::Decision(e) => {
                check_len("source", &e.source, MAX_POLICY_NAME).at("decision")?;
                check_len("action", &e.action, MAX_POLICY_NAME).at("decision")?;
                check_len("reason", &e.reason, MAX_DECISION_REASON).at("decision")?;
                ClusterEvent::Decision {
                    source: e.source,
                    action: e.action,
                    reason: e.reason,
                }
            }
        };
        Ok(WatchEvent {
            revision: w.revision,
            at_ms: w.at_ms,
            event,
        })
    }
}

impl From<WatchBatch> for wire::WatchResponse {
    fn from(b: WatchBatch) -> Self {
        wire::WatchResponse {
            events: b
                .events
                .into_iter()
                .map(|e| wire::WatchResponse::encode_event(&e.into()))
                .collect(),
            revision: b.revision,
        }
    }
}

impl TryFrom<wire::WatchResponse> for WatchBatch {
    type Error = ConvertError;
    fn try_from(w: wire::WatchResponse) -> Result<Self, ConvertError> {
        let decoded = w.decode_events().map_err(|_| {
            let why = "an event is not a WatchEvent message";
            ConvertError::new("events", Problem::Rule(why))
        })?;
        Ok(WatchBatch {
            events: convert_list(decoded, "events", usize::MAX, TryFrom::try_from)?,
            revision: w.revision,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::types::{Capacity, Namespace, TaskState};

    fn event(revision: u64, event: ClusterEvent) -> WatchEvent {
        WatchEvent {
            revision,
            at_ms: 1_700_000_000_000 + revision,
            event,
        }
    }

    #[test]
    fn every_event_round_trips() {
        let ns = Some(Namespace::new("team-a").unwrap());
        let events = vec![
            event(
                1,
                ClusterEvent::Submitted {
                    task: TaskId(1),
                    name: "map".into(),
                    namespace: ns.clone(),
                },
            ),
            event(
                2,
                ClusterEvent::Started {
                    task: TaskId(1),
                    node: NodeId(3),
                    attempt: 1,
                    namespace: None,
                },
            ),
            event(
                3,
                ClusterEvent::Finished {
                    task: TaskId(1),
                    state: TaskState::Failed,
                    reason: Some("exited with code 2".into()),
                    attempt: 1,
                    namespace: ns.clone(),
                },
            ),
            event(
                4,
                ClusterEvent::Pending {
                    task: TaskId(2),
                    reason: None,
                    namespace: ns,
                },
            ),
            event(
                5,
                ClusterEvent::Resource {
                    node: NodeId(3),
                    name: ResourceName::new("data-7").unwrap(),
                    capacity: Some(Capacity::Unbounded),
                },
            ),
            event(
                6,
                ClusterEvent::Resource {
                    node: NodeId(3),
                    name: ResourceName::new("data-7").unwrap(),
                    capacity: None,
                },
            ),
            event(
                7,
                ClusterEvent::Node {
                    node: NodeId(3),
                    name: "gpu-box".into(),
                    change: NodeChange::Lost,
                    reason: Some("no heartbeat for 10s".into()),
                },
            ),
            event(
                8,
                ClusterEvent::Reservation {
                    name: ResourceName::new("train").unwrap(),
                    placed: Some((TaskId(9), NodeId(3))),
                },
            ),
            event(
                9,
                ClusterEvent::Reservation {
                    name: ResourceName::new("train").unwrap(),
                    placed: None,
                },
            ),
            event(
                10,
                ClusterEvent::Actor {
                    actor: TaskId(4),
                    name: Some("ps".into()),
                    change: ActorChange::Restarting,
                    incarnation: 1,
                    node: Some(NodeId(3)),
                    reason: Some("node 3 lost".into()),
                    namespace: Some(Namespace::new("team-a").unwrap()),
                },
            ),
            event(
                11,
                ClusterEvent::Actor {
                    actor: TaskId(4),
                    name: None,
                    change: ActorChange::Died,
                    incarnation: 0,
                    node: None,
                    reason: None,
                    namespace: None,
                },
            ),
        ];
        let batch = WatchBatch {
            events,
            revision: 11,
        };
        let wire: wire::WatchResponse = batch.clone().into();
        assert_eq!(WatchBatch::try_from(wire).unwrap(), batch);
    }

    #[test]
    fn requests_round_trip_and_kinds_are_deduplicated() {
        let request = WatchRequest {
            after: Some(41),
            namespace: Some(Namespace::new("team-a").unwrap()),
            tasks: vec![TaskId(1), TaskId(2)],
            labels: vec![("stage".into(), Some("map".into())), ("gpu".into(), None)],
            kinds: vec![WatchKind::Finished, WatchKind::Started],
        };
        let mut wire: wire::WatchRequest = request.clone().into();
        wire.kinds.push(wire::WatchKind::Finished.into());
        let back = WatchRequest::try_from(wire).unwrap();
        assert_eq!(back.kinds, vec![WatchKind::Started, WatchKind::Finished]);
        assert_eq!(back.tasks, request.tasks);
        assert_eq!(back.labels, request.labels);
        assert_eq!(back.after, Some(41));
    }

    #[test]
    fn bad_requests_name_the_field() {
        let bad_kind = wire::WatchRequest {
            kinds: vec![0],
            ..Default::default()
        };
        let err = WatchRequest::try_from(bad_kind).unwrap_err();
        assert_eq!(err.path(), "kinds[0]");
        let bad_label = wire::WatchRequest {
            labels: vec!["=x".into()],
            ..Default::default()
        };
        let err = WatchRequest::try_from(bad_label).unwrap_err();
        assert_eq!(err.path(), "labels[0]");
        let bad_ns = wire::WatchRequest {
            namespace: "Not A Namespace".into(),
            ..Default::default()
        };
        assert_eq!(
            WatchRequest::try_from(bad_ns).unwrap_err().path(),
            "namespace"
        );
        let too_many = wire::WatchRequest {
            task_ids: vec![1; MAX_WATCH_TASKS + 1],
            ..Default::default()
        };
        assert!(WatchRequest::try_from(too_many).is_err());
    }

    #[test]
    fn a_reservation_event_is_placed_or_released() {
        let half = wire::WatchEvent {
            revision: 1,
            at_ms: 0,
            event: Some(W::Reservation(wire::ReservationChangedEvent {
                name: "train".into(),
                task_id: Some(3),
                node: None,
                released: false,
            })),
        };
        let err = WatchEvent::try_from(half).unwrap_err();
        assert_eq!(err.path(), "reservation");
        let empty = wire::WatchEvent {
            revision: 1,
            at_ms: 0,
            event: None,
        };
        assert_eq!(WatchEvent::try_from(empty).unwrap_err().path(), "event");
    }
}
