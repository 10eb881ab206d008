//! What goes into the scheduler core and what comes out.

use std::fmt;
use std::sync::Arc;

use escher_proto::types::{
    Amount, Capacity, CapacityOp, Labels, NodeId, NodeSpec, ResourceName, ResourceSet, TaskId,
};

/// Milliseconds on whatever clock the caller uses; the core only compares them.
pub type Millis = u64;

/// Something that happened, fed to [`Scheduler::handle`](super::Scheduler::handle).
#[derive(Debug, Clone, PartialEq)]
pub enum Event {
    /// A node joined with these capacities.
    NodeAdded {
        /// The new node.
        node: NodeId,
        /// What it has. Zero capacities are ignored.
        resources: Vec<(ResourceName, Capacity)>,
        /// Its labels.
        labels: Labels,
    },
    /// A node left or was declared dead; its running tasks are reported [`Decision::Lost`].
    NodeRemoved {
        /// The node.
        node: NodeId,
    },
    /// `set_resource`: change `name` on the nodes `target` selects. `NodeSpec::Local` must be
    /// resolved to a node by the caller first. All targeted nodes change, or none.
    ResourceChanged {
        /// Which nodes.
        target: NodeSpec,
        /// Which resource.
        name: ResourceName,
        /// What to do.
        op: CapacityOp,
    },
    /// A task wants to run.
    TaskSubmitted {
        /// The task (unique among tasks the core knows).
        task: TaskId,
        /// What it needs while it runs.
        resources: ResourceSet,
        /// If still pending at this time, give up on it.
        deadline: Option<Millis>,
    },
    /// A running task ended; what it held is released.
    TaskFinished {
        /// The task.
        task: TaskId,
    },
    /// A pending or running task is withdrawn; what it held is released.
    TaskCancelled {
        /// The task.
        task: TaskId,
    },
    /// Time passed; expire pending deadlines.
    Tick,
}

/// What the core decided, in the order it decided it.
#[derive(Debug, Clone, PartialEq)]
pub enum Decision {
    /// Run `task` on `node`. It holds exactly its requirements there until it finishes.
    Dispatch {
        /// The task.
        task: TaskId,
        /// Where.
        node: NodeId,
    },
    /// No live node could run `task` even if idle; it stays pending.
    Infeasible {
        /// The task.
        task: TaskId,
        /// Why, shared by every task of the same shape.
        reason: Arc<InfeasibleReason>,
    },
    /// A task reported infeasible could now run somewhere (it may still have to wait).
    Feasible {
        /// The task.
        task: TaskId,
    },
    /// A pending task's deadline passed; the core has forgotten it.
    DeadlinePassed {
        /// The task.
        task: TaskId,
    },
    /// A running task's node was removed; the core has forgotten the task.
    Lost {
        /// The task.
        task: TaskId,
        /// The node it was running on.
        node: NodeId,
    },
}

/// Why a pending task cannot run anywhere.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct InfeasibleReason {
    /// The resource that stands in the way.
    pub resource: ResourceName,
    /// How much of it the task requests.
    pub requested: Amount,
    /// The largest capacity of it on any live node (`None`: no live node has it).
    pub best_total: Option<Capacity>,
    /// The live nodes that came closest (fewest requirements they could never meet), best first.
    pub closest: Vec<NodeId>,
}

impl fmt::Display for InfeasibleReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let (name, requested) = (&self.resource, self.requested);
        match self.best_total {
            None => write!(
                f,
                "resource {name} (requested {requested}) exists on no live node"
            )?,
            Some(best) if !best.could_hold(requested) => write!(
                f,
                "requests {requested} {name}, but no live node has more than {best} in total"
            )?,
            Some(_) => write!(
                f,
                "no live node has all requested resources together; {name} ({requested}) is \
                 missing on the closest nodes"
            )?,
        }
        if !self.closest.is_empty() {
            let ids: Vec<String> = self.closest.iter().map(ToString::to_string).collect();
            write!(f, " (closest nodes: {})", ids.join(", "))?;
        }
        Ok(())
    }
}
