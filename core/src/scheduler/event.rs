//! What goes into the scheduler core and what comes out.

use std::sync::Arc;

use escher_proto::types::{
    Amount, Capacity, CapacityOp, GangStrategy, Labels, NodeId, NodeSpec, PendingReason,
    ResourceName, ResourceSet, TaskId,
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
        /// How long it may run once started (its `timeout`), if it has a limit: it is placed only
        /// on a node that lasts that long (one without an [`ENDS_AT_LABEL`], or whose end is at
        /// least this far from the time of the placement).
        ///
        /// [`ENDS_AT_LABEL`]: escher_proto::types::ENDS_AT_LABEL
        time_limit: Option<Millis>,
    },
    /// Tasks (one per bundle) to dispatch all together or not at all. Each must be new.
    GangSubmitted {
        /// The members and what each needs, in bundle order.
        tasks: Vec<(TaskId, ResourceSet)>,
        /// How the bundles may be spread over nodes.
        strategy: GangStrategy,
        /// If still pending at this time, give up on all of them.
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

/// Why a pending task cannot run anywhere: the API's pending reason, produced by the core.
pub type InfeasibleReason = PendingReason;

/// The message of a strict-spread gang that no set of distinct nodes could hold.
pub(crate) fn describe_spread(bundles: usize, matched: usize, capable: usize) -> String {
    format!(
        "a strict-spread reservation of {bundles} bundles needs {bundles} distinct live nodes \
         that can each hold one; at most {matched} can be found ({capable} live nodes could \
         hold some bundle)"
    )
}

/// Writes the human-readable message of a pending reason from its fields.
pub(crate) fn describe(
    resource: &ResourceName,
    requested: Amount,
    best_total: Option<Capacity>,
    closest: &[NodeId],
    same_but_case: Option<ResourceName>,
) -> String {
    let mut text = match (best_total, same_but_case) {
        (None, Some(near)) => format!(
            "resource {resource} (requested {requested}) exists on no live node; did you mean \
             {near}? Resource names are case-sensitive"
        ),
        (None, None) => {
            format!("resource {resource} (requested {requested}) exists on no live node")
        }
        (Some(best), _) if !best.could_hold(requested) => format!(
            "requests {requested} {resource}, but no live node has more than {best} in total"
        ),
        (Some(_), _) => format!(
            "no live node has all requested resources together; {resource} ({requested}) is \
             missing on the closest nodes"
        ),
    };
    if !closest.is_empty() {
        let ids: Vec<String> = closest.iter().map(ToString::to_string).collect();
        text.push_str(&format!(" (closest nodes: {})", ids.join(", ")));
    }
    text
}
