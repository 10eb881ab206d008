//! Where `set_resource` applies: the calling task's node, one node, or every node that matches.

use serde::{Deserialize, Serialize};

use super::{NodeId, ResourceSet};

/// Which nodes a `set_resource` call changes (docs/DESIGN.md §3).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum NodeSpec {
    /// The node of the calling task. Only a task's own context can use it; a client outside
    /// the cluster gets an error.
    Local,
    /// Exactly this node.
    Node(NodeId),
    /// Every live node whose **available** resources contain `resources`, in ascending node id
    /// order, or only the first `num_nodes` of them.
    Match {
        /// The resources a node must have available to be chosen (empty: every live node).
        resources: ResourceSet,
        /// At most this many nodes; `None` for all that match.
        num_nodes: Option<u32>,
    },
}
