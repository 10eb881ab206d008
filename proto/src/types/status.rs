//! What the cluster API reports: node and resource status, why a task is pending, what is
//! known about a task, and which output stream of a task to read.
//!
//! Plain data for the head to fill in and clients to read; the head computes the figures,
//! these types only carry them.

use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Serialize};

use super::{
    Amount, Capacity, Labels, Namespace, NodeId, ResourceName, ResourceSet, TaskId, TaskSpec,
    TaskState, TaskStatus,
};

/// The state of the whole cluster, as `get_cluster_status` returns it (docs/DESIGN.md §3).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ClusterStatus {
    /// Every node the head knows, live or not, in ascending id order.
    pub nodes: Vec<NodeStatus>,
    /// How many tasks are pending.
    pub pending_tasks: u64,
    /// How many tasks are running.
    pub running_tasks: u64,
    /// When asked for: the tasks the head keeps, by namespace, in namespace order.
    #[serde(default)]
    pub namespaces: Vec<TaskCounts>,
    /// How many actor method calls wait at the live actors the caller sees, as their workers'
    /// latest heartbeats said (`None`: the answering replica hears no heartbeats).
    #[serde(default)]
    pub pending_actor_calls: Option<u64>,
}

/// How many tasks of one namespace are in each state (of those the head keeps: retention drops
/// finished ones).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct TaskCounts {
    /// The namespace; `None` for tasks of no namespace.
    pub namespace: Option<Namespace>,
    /// Waiting for a node.
    pub pending: u64,
    /// Dispatched.
    pub running: u64,
    /// Finished successfully.
    pub succeeded: u64,
    /// Failed.
    pub failed: u64,
    /// Cancelled.
    pub cancelled: u64,
}

impl TaskCounts {
    /// Counts one more task in `state`.
    pub fn add(&mut self, state: TaskState) {
        match state {
            TaskState::Pending => self.pending += 1,
            TaskState::Running => self.running += 1,
            TaskState::Succeeded => self.succeeded += 1,
            TaskState::Failed => self.failed += 1,
            TaskState::Cancelled => self.cancelled += 1,
        }
    }
}

impl ClusterStatus {
    /// The node with this id.
    pub fn node(&self, id: NodeId) -> Option<&NodeStatus> {
        self.nodes.iter().find(|n| n.id == id)
    }
}

/// One node: who it is, whether it is alive, and its resources.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct NodeStatus {
    /// The node id.
    pub id: NodeId,
    /// The worker's name.
    pub name: String,
    /// The worker's address.
    pub address: String,
    /// Whether the head hears from it.
    pub alive: bool,
    /// Its labels.
    pub labels: Labels,
    /// Its resources, in name order.
    pub resources: Vec<ResourceStatus>,
    /// When it left, in milliseconds since the Unix epoch, if it is no longer live.
    pub left_at_ms: Option<u64>,
    /// Why it left, if it is no longer live.
    pub left_because: Option<String>,
    /// What its worker last said about its fence supervisor, if anything happened to it
    /// (restarted, down or none; DESIGN §13). Shown by the leading replica only.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fence: Option<String>,
    /// Registered and live, but its worker's stream is not attached yet: the scheduler places
    /// nothing there and its resources show only once it is (a worker that registered and
    /// never attaches is declared lost a heartbeat timeout later). Read placement and capacity
    /// from [`NodeStatus::takes_tasks`], not from `alive` alone.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub waiting_for_stream: bool,
}

impl NodeStatus {
    /// Whether the scheduler can place tasks here now: live, with its worker's stream
    /// attached, and its disk not under its reserve
    /// ([`DISK_UNDER_RESERVE_LABEL`](super::DISK_UNDER_RESERVE_LABEL)). A policy that reads
    /// capacity or chooses nodes from the status filters by this.
    pub fn takes_tasks(&self) -> bool {
        self.alive && !self.waiting_for_stream && !super::under_disk_reserve(&self.labels)
    }

    /// The status of resource `name` on this node.
    pub fn resource(&self, name: &str) -> Option<&ResourceStatus> {
        self.resources.iter().find(|r| r.name.as_str() == name)
    }
}

/// One resource on one node: its capacity and how much running tasks hold.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ResourceStatus {
    /// The resource.
    pub name: ResourceName,
    /// Its capacity.
    pub total: Capacity,
    /// How much running tasks hold. May exceed a finite `total` after the capacity shrank
    /// below what was in use (docs/DESIGN.md §3); see [`ResourceStatus::shortfall`].
    pub used: Amount,
}

impl ResourceStatus {
    /// What is left to allocate: `None` for an unbounded capacity, zero when in shortfall.
    pub fn available(&self) -> Option<Amount> {
        self.total.available(self.used)
    }

    /// How far use is above a finite total (zero when it is not, and for unbounded ones).
    pub fn shortfall(&self) -> Amount {
        match self.total {
            Capacity::Finite(total) => self.used.saturating_sub(total),
            Capacity::Unbounded => Amount::ZERO,
        }
    }
}

/// Why a pending task cannot be placed now: which resource, how much, and what is closest.
///
/// Displays as its `message`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PendingReason {
    /// The resource no live node has enough of.
    pub resource: ResourceName,
    /// How much of it the task requests.
    pub requested: Amount,
    /// The largest total any live node has of it; `None` if no live node has it at all.
    pub best_total: Option<Capacity>,
    /// The nodes closest to fitting, best first.
    pub closest_nodes: Vec<NodeId>,
    /// A sentence for people, naming the resource and the amounts.
    pub message: String,
}

impl fmt::Display for PendingReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.message)
    }
}

/// Everything known about one task (`escher describe`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TaskInfo {
    /// What was submitted.
    pub spec: TaskSpec,
    /// Where it is now.
    pub status: TaskStatus,
    /// Why it cannot be placed now, if it is pending and infeasible.
    pub pending_reason: Option<PendingReason>,
    /// When it was submitted, in milliseconds since the Unix epoch.
    pub submitted_at_ms: u64,
    /// When its latest attempt started, in milliseconds since the Unix epoch.
    pub started_at_ms: Option<u64>,
    /// When it finished, in milliseconds since the Unix epoch.
    pub finished_at_ms: Option<u64>,
    /// Its attempts, oldest first (the last [`MAX_ATTEMPTS_KEPT`]).
    pub attempts: Vec<AttemptInfo>,
    /// The running task that submitted it (with its task credential), if any.
    #[serde(default)]
    pub parent: Option<TaskId>,
}

/// How many attempts of a task the head remembers (node, start, end, output tail).
pub const MAX_ATTEMPTS_KEPT: usize = 16;

/// One attempt of a task.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct AttemptInfo {
    /// Its number, from 1.
    pub attempt: u32,
    /// The node it was sent to.
    pub node: NodeId,
    /// When it was sent, in milliseconds since the Unix epoch.
    pub started_at_ms: u64,
    /// How it ended; `None` while it runs.
    pub ended: Option<String>,
    /// Whether the head keeps the tail of its output.
    pub output_kept: bool,
}

/// One line of a task listing (`escher tasks`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct TaskSummary {
    /// The task.
    pub id: TaskId,
    /// Its name.
    pub name: String,
    /// Its state.
    pub state: TaskState,
    /// The node of its latest attempt.
    pub node: Option<NodeId>,
    /// Which attempt, from 1.
    pub attempt: u32,
    /// Why it is pending, failed or cancelled.
    pub reason: Option<String>,
    /// What it requests.
    pub resources: ResourceSet,
    /// When it was submitted, in milliseconds since the Unix epoch.
    pub submitted_at_ms: u64,
    /// When its latest attempt started, once one has.
    pub started_at_ms: Option<u64>,
    /// When it reached its final state, once it has.
    pub finished_at_ms: Option<u64>,
    /// Its namespace; `None` for an admin's task that named none.
    pub namespace: Option<Namespace>,
}

/// Which output stream of a command task.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum LogStream {
    /// Standard output.
    Stdout,
    /// Standard error.
    Stderr,
}

impl LogStream {
    /// `stdout` or `stderr`.
    pub fn as_str(self) -> &'static str {
        match self {
            LogStream::Stdout => "stdout",
            LogStream::Stderr => "stderr",
        }
    }
}

impl fmt::Display for LogStream {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for LogStream {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s.trim().to_ascii_lowercase().as_str() {
            "stdout" | "out" => Ok(LogStream::Stdout),
            "stderr" | "err" => Ok(LogStream::Stderr),
            other => Err(format!(
                "unknown log stream {other:?}: expected stdout or stderr"
            )),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn res(name: &str, total: &str, used: &str) -> ResourceStatus {
        ResourceStatus {
            name: ResourceName::new(name).unwrap(),
            total: total.parse().unwrap(),
            used: used.parse().unwrap(),
        }
    }

    #[test]
    fn available_and_shortfall() {
        let r = res("cpu", "4", "1.5");
        assert_eq!(r.available(), Some("2.5".parse().unwrap()));
        assert_eq!(r.shortfall(), Amount::ZERO);
        let shrunk = res("x", "1", "3");
        assert_eq!(shrunk.available(), Some(Amount::ZERO));
        assert_eq!(shrunk.shortfall(), Amount::units(2).unwrap());
        let unbounded = res("loc", "unbounded", "7");
        assert_eq!(unbounded.available(), None);
        assert_eq!(unbounded.shortfall(), Amount::ZERO);
    }

    #[test]
    fn lookups_and_display() {
        let node = NodeStatus {
            id: NodeId(2),
            name: "w".into(),
            address: "a".into(),
            alive: true,
            labels: Labels::new(),
            resources: vec![res("cpu", "4", "0")],
            left_at_ms: None,
            left_because: None,
            fence: None,
            waiting_for_stream: false,
        };
        assert!(node.resource("cpu").is_some());
        assert!(node.resource("gpu").is_none());
        let status = ClusterStatus {
            nodes: vec![node],
            pending_tasks: 0,
            running_tasks: 0,
            namespaces: Vec::new(),
            pending_actor_calls: None,
        };
        assert_eq!(status.node(NodeId(2)).map(|n| n.name.as_str()), Some("w"));
        let reason = PendingReason {
            resource: ResourceName::gpu(),
            requested: Amount::ONE,
            best_total: None,
            closest_nodes: vec![],
            message: "no live node has gpu".into(),
        };
        assert_eq!(reason.to_string(), "no live node has gpu");
        assert_eq!("STDERR".parse::<LogStream>().unwrap(), LogStream::Stderr);
        assert_eq!(LogStream::Stdout.to_string(), "stdout");
        assert!("both".parse::<LogStream>().is_err());
    }
}
