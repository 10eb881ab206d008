//! The watch API (docs/DESIGN.md §11): what happens in the cluster, as it is committed, each event
//! with a revision a watcher can resume from.

use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Serialize};

use super::{Capacity, Namespace, NodeId, ResourceName, TaskId, TaskState, TypeError};

/// The most task ids one watch may name.
pub const MAX_WATCH_TASKS: usize = 10_000;

/// `Watch`: which events to stream, and from where. Filters combine with AND; an empty filter
/// matches everything the caller may see.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct WatchRequest {
    /// Resume after this revision (the last one the watcher saw); `None` starts from now.
    pub after: Option<u64>,
    /// Only events of this namespace (an application caller sees its own only).
    pub namespace: Option<Namespace>,
    /// Only events of these tasks (task events only).
    pub tasks: Vec<TaskId>,
    /// Only events of tasks carrying every one of these labels: a key and a value, or a key
    /// alone for any value (task events only).
    pub labels: Vec<(String, Option<String>)>,
    /// Only these kinds; empty for all.
    pub kinds: Vec<WatchKind>,
}

impl WatchRequest {
    /// Every event the caller may see, from now on.
    pub fn all() -> WatchRequest {
        WatchRequest::default()
    }

    /// The events of these tasks only.
    pub fn tasks(tasks: impl IntoIterator<Item = TaskId>) -> WatchRequest {
        WatchRequest {
            tasks: tasks.into_iter().collect(),
            ..WatchRequest::default()
        }
    }

    /// Only these kinds.
    pub fn kinds(mut self, kinds: impl IntoIterator<Item = WatchKind>) -> WatchRequest {
        self.kinds = kinds.into_iter().collect();
        self
    }

    /// Resumes after `revision`.
    pub fn after(mut self, revision: u64) -> WatchRequest {
        self.after = Some(revision);
        self
    }

    /// Whether the filter restricts events to some tasks (by id or label): then only task
    /// events can match.
    pub fn tasks_only(&self) -> bool {
        !self.tasks.is_empty() || !self.labels.is_empty()
    }
}

/// The kinds of event.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub enum WatchKind {
    /// A task was accepted.
    Submitted,
    /// An attempt of a task was dispatched to a node.
    Started,
    /// A task reached its final state.
    Finished,
    /// Why a task is pending changed.
    Pending,
    /// A resource's capacity on a node changed.
    Resource,
    /// A node joined, came back, started draining or was lost.
    Node,
    /// A reservation's bundle was placed, or the reservation was released.
    Reservation,
    /// An actor's incarnation became ready, ended and restarts, or the actor died.
    Actor,
    /// A client of the head that acts on the cluster (the autoscaler) decided something.
    Decision,
}

impl WatchKind {
    /// Every kind, in wire order.
    pub const ALL: [WatchKind; 9] = [
        WatchKind::Submitted,
        WatchKind::Started,
        WatchKind::Finished,
        WatchKind::Pending,
        WatchKind::Resource,
        WatchKind::Node,
        WatchKind::Reservation,
        WatchKind::Actor,
        WatchKind::Decision,
    ];

    /// Its name in the CLI and in messages.
    pub fn as_str(self) -> &'static str {
        match self {
            WatchKind::Submitted => "submitted",
            WatchKind::Started => "started",
            WatchKind::Finished => "finished",
            WatchKind::Pending => "pending",
            WatchKind::Resource => "resource",
            WatchKind::Node => "node",
            WatchKind::Reservation => "reservation",
            WatchKind::Actor => "actor",
            WatchKind::Decision => "decision",
        }
    }

    /// Whether events of this kind are about one task (an actor's are about its task).
    pub fn is_task(self) -> bool {
        matches!(
            self,
            WatchKind::Submitted
                | WatchKind::Started
                | WatchKind::Finished
                | WatchKind::Pending
                | WatchKind::Actor
        )
    }
}

impl fmt::Display for WatchKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for WatchKind {
    type Err = TypeError;
    fn from_str(s: &str) -> Result<WatchKind, TypeError> {
        WatchKind::ALL
            .into_iter()
            .find(|k| k.as_str() == s)
            .ok_or_else(|| TypeError::Invalid {
                what: "event kind",
                value: s.to_string(),
                why: "expected submitted, started, finished, pending, resource, node, \
                      reservation, actor or decision",
            })
    }
}

/// One thing that happened, with its place in the cluster's history.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct WatchEvent {
    /// Its revision: one more than the event recorded before it.
    pub revision: u64,
    /// When it was committed (milliseconds since the Unix epoch, on the leader's clock).
    pub at_ms: u64,
    /// What happened.
    pub event: ClusterEvent,
}

/// What happened.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum ClusterEvent {
    /// A task was accepted.
    Submitted {
        /// The task.
        task: TaskId,
        /// Its name.
        name: String,
        /// Its namespace.
        namespace: Option<Namespace>,
    },
    /// An attempt of a task was dispatched to a node.
    Started {
        /// The task.
        task: TaskId,
        /// Where.
        node: NodeId,
        /// Which attempt, from 1.
        attempt: u32,
        /// Its namespace.
        namespace: Option<Namespace>,
    },
    /// A task reached its final state.
    Finished {
        /// The task.
        task: TaskId,
        /// Succeeded, failed or cancelled.
        state: TaskState,
        /// Why it failed or was cancelled.
        reason: Option<String>,
        /// Its last attempt (0 if it never ran).
        attempt: u32,
        /// Its namespace.
        namespace: Option<Namespace>,
    },
    /// Why a task is pending changed.
    Pending {
        /// The task.
        task: TaskId,
        /// Why it waits now; `None` when nothing keeps it from being placed.
        reason: Option<String>,
        /// Its namespace.
        namespace: Option<Namespace>,
    },
    /// A resource's capacity on a node changed.
    Resource {
        /// The node.
        node: NodeId,
        /// The resource.
        name: ResourceName,
        /// Its capacity now; `None` when it was deleted.
        capacity: Option<Capacity>,
    },
    /// Something happened to a node.
    Node {
        /// The node.
        node: NodeId,
        /// Its worker's name.
        name: String,
        /// What.
        change: NodeChange,
        /// Why, for a lost node.
        reason: Option<String>,
    },
    /// A reservation's bundle was placed (`placed` holds its holder task and node), or the
    /// reservation was released (`placed` is `None`).
    Reservation {
        /// The reservation's name.
        name: ResourceName,
        /// The holder and its node, for a placed bundle.
        placed: Option<(TaskId, NodeId)>,
    },
    /// Something happened to an actor: an incarnation became ready, ended and is restarted,
    /// or the actor died for good. Its task's own events (started, pending, finished) are
    /// recorded beside these.
    Actor {
        /// The actor (its task's id).
        actor: TaskId,
        /// Its name, if it has one.
        name: Option<String>,
        /// What.
        change: ActorChange,
        /// The incarnation it is about (its task's attempt, from 1; 0 for an actor that died
        /// before it was ever placed).
        incarnation: u32,
        /// The node of that incarnation, if it was placed.
        node: Option<NodeId>,
        /// Why the incarnation ended, for a restart or a death.
        reason: Option<String>,
        /// Its namespace.
        namespace: Option<Namespace>,
    },
    /// A client of the head that acts on the cluster decided something, and said why: an
    /// autoscaler launching, draining or stopping workers, or holding (`RecordDecision`). Last
    /// of the variants.
    Decision {
        /// Who decided (`autoscaler/GROUP`).
        source: String,
        /// What, in one word (`launch`, `drain`, `stop`, `hold`).
        action: String,
        /// Why.
        reason: String,
    },
}

/// The longest reason of a [`ClusterEvent::Decision`], in bytes.
pub const MAX_DECISION_REASON: usize = 1024;

/// Checks a decision's source, action and reason ([`ClusterEvent::Decision`]): the source and
/// action are policy-like names (1 to 63 bytes of letters, digits, `-`, `_`, `.`, `/`), the
/// reason at most [`MAX_DECISION_REASON`] bytes; the first problem found.
pub fn check_decision(source: &str, action: &str, reason: &str) -> Result<(), String> {
    super::check_policy_name("decision source", source)?;
    super::check_policy_name("decision action", action)?;
    if reason.len() > MAX_DECISION_REASON {
        return Err(format!(
            "a decision's reason is at most {MAX_DECISION_REASON} bytes, this one {}",
            reason.len()
        ));
    }
    Ok(())
}

impl ClusterEvent {
    /// Its kind.
    pub fn kind(&self) -> WatchKind {
        match self {
            ClusterEvent::Submitted { .. } => WatchKind::Submitted,
            ClusterEvent::Started { .. } => WatchKind::Started,
            ClusterEvent::Finished { .. } => WatchKind::Finished,
            ClusterEvent::Pending { .. } => WatchKind::Pending,
            ClusterEvent::Resource { .. } => WatchKind::Resource,
            ClusterEvent::Node { .. } => WatchKind::Node,
            ClusterEvent::Reservation { .. } => WatchKind::Reservation,
            ClusterEvent::Actor { .. } => WatchKind::Actor,
            ClusterEvent::Decision { .. } => WatchKind::Decision,
        }
    }

    /// The task it is about, for a task event.
    pub fn task(&self) -> Option<TaskId> {
        match self {
            ClusterEvent::Submitted { task, .. }
            | ClusterEvent::Started { task, .. }
            | ClusterEvent::Finished { task, .. }
            | ClusterEvent::Pending { task, .. } => Some(*task),
            ClusterEvent::Actor { actor, .. } => Some(*actor),
            _ => None,
        }
    }

    /// The namespace of a task event's task.
    pub fn task_namespace(&self) -> Option<&Namespace> {
        match self {
            ClusterEvent::Submitted { namespace, .. }
            | ClusterEvent::Started { namespace, .. }
            | ClusterEvent::Finished { namespace, .. }
            | ClusterEvent::Pending { namespace, .. }
            | ClusterEvent::Actor { namespace, .. } => namespace.as_ref(),
            _ => None,
        }
    }

    /// The resource name it is about, for a resource or reservation event.
    pub fn resource(&self) -> Option<&ResourceName> {
        match self {
            ClusterEvent::Resource { name, .. } | ClusterEvent::Reservation { name, .. } => {
                Some(name)
            }
            _ => None,
        }
    }
}

impl fmt::Display for ClusterEvent {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ClusterEvent::Submitted { task, name, .. } if name.is_empty() => {
                write!(f, "task {task} submitted")
            }
            ClusterEvent::Submitted { task, name, .. } => {
                write!(f, "task {task} ({name}) submitted")
            }
            ClusterEvent::Started {
                task,
                node,
                attempt,
                ..
            } => write!(f, "task {task} attempt {attempt} started on node {node}"),
            ClusterEvent::Finished {
                task,
                state,
                reason: Some(why),
                ..
            } => write!(f, "task {task} {state}: {why}"),
            ClusterEvent::Finished { task, state, .. } => write!(f, "task {task} {state}"),
            ClusterEvent::Pending {
                task,
                reason: Some(why),
                ..
            } => write!(f, "task {task} pending: {why}"),
            ClusterEvent::Pending { task, .. } => {
                write!(f, "task {task} pending: placeable again")
            }
            ClusterEvent::Resource {
                node,
                name,
                capacity: Some(c),
            } => write!(f, "resource {name} on node {node}: capacity {c}"),
            ClusterEvent::Resource { node, name, .. } => {
                write!(f, "resource {name} on node {node}: deleted")
            }
            ClusterEvent::Node {
                node,
                name,
                change,
                reason,
            } => {
                write!(f, "node {node} ({name}) {change}")?;
                match reason {
                    Some(why) => write!(f, ": {why}"),
                    None => Ok(()),
                }
            }
            ClusterEvent::Reservation {
                name,
                placed: Some((task, node)),
            } => write!(
                f,
                "reservation {name}: bundle of task {task} placed on node {node}"
            ),
            ClusterEvent::Reservation { name, placed: None } => {
                write!(f, "reservation {name} released")
            }
            ClusterEvent::Actor {
                actor,
                name,
                change,
                incarnation,
                node,
                reason,
                ..
            } => {
                write!(f, "actor {actor}")?;
                if let Some(name) = name {
                    write!(f, " ({name})")?;
                }
                let on = node.map(|n| format!(" on node {n}")).unwrap_or_default();
                match change {
                    ActorChange::Ready => write!(f, " incarnation {incarnation} ready{on}")?,
                    ActorChange::Restarting => {
                        write!(f, " incarnation {incarnation}{on} ended; restarting")?
                    }
                    ActorChange::Died if *incarnation == 0 => write!(f, " died before it ran")?,
                    ActorChange::Died => write!(f, " died in incarnation {incarnation}{on}")?,
                }
                match reason {
                    Some(why) => write!(f, ": {why}"),
                    None => Ok(()),
                }
            }
            ClusterEvent::Decision {
                source,
                action,
                reason,
            } => write!(f, "{source} decided {action}: {reason}"),
        }
    }
}

/// What happened to a node.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum NodeChange {
    /// A new worker registered.
    Joined,
    /// A known worker registered again.
    Rejoined,
    /// It admits nothing new; its running tasks finish.
    Draining,
    /// It is no longer live.
    Lost,
    /// Its labels changed while it ran (`escher node label`, or its walltime about to end).
    Labelled,
}

impl fmt::Display for NodeChange {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            NodeChange::Joined => "joined",
            NodeChange::Rejoined => "rejoined",
            NodeChange::Draining => "draining",
            NodeChange::Lost => "lost",
            NodeChange::Labelled => "labelled",
        })
    }
}

/// What happened to an actor.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum ActorChange {
    /// An incarnation's constructor returned: it serves calls.
    Ready,
    /// An incarnation ended and the actor is placed again (a restart is its task's retry).
    Restarting,
    /// The actor ended for good: killed, out of restarts, or never placed.
    Died,
}

impl ActorChange {
    /// Its name in messages.
    pub fn as_str(self) -> &'static str {
        match self {
            ActorChange::Ready => "ready",
            ActorChange::Restarting => "restarting",
            ActorChange::Died => "died",
        }
    }
}

impl fmt::Display for ActorChange {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// One message of a watch stream: events in revision order, and the revision the watcher
/// has seen everything up to.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct WatchBatch {
    /// The events.
    pub events: Vec<WatchEvent>,
    /// The last event's revision, or (in a stream's first message) the head's current one.
    pub revision: u64,
}
