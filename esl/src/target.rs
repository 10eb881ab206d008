//! Targeted placement, the building block of the policies that choose a node themselves
//! (dynamic load balancing, bin packing): a unique marker `<prefix>-<node id>` with unbounded
//! capacity on node `N`, which a task requests to run on `N` (thesis Table 4.2, "targeted
//! placement", §4.3.5).
//!
//! The marker is unbounded, so it only says *where*; the task's own physical requirements
//! still go through admission control on that node. Markers are set again before each use
//! (one idempotent batch), so a marker deleted by someone else comes back.

use escher_proto::types::{
    Amount, Capacity, CapacityOp, NodeId, NodeSpec, ResourceName, ResourceUpdate,
};

use crate::policy::{er_name, every_node};
use crate::{ClusterApi, EslError, ResourceSpec};

/// Per-node markers under one prefix.
#[derive(Debug, Clone)]
pub(crate) struct Targets {
    prefix: String,
}

impl Targets {
    pub(crate) fn new(prefix: &str) -> Targets {
        Targets {
            prefix: prefix.to_string(),
        }
    }

    /// The marker of `node`.
    pub(crate) fn marker(&self, node: NodeId) -> Result<ResourceName, EslError> {
        er_name(&[&self.prefix, &node.0.to_string()])
    }

    /// Makes sure the markers of `nodes` exist, in one batch; the spec pinning a task to each.
    pub(crate) async fn pin<C: ClusterApi>(
        &self,
        cluster: &C,
        nodes: &[NodeId],
    ) -> Result<Vec<ResourceSpec>, EslError> {
        let mut distinct: Vec<NodeId> = nodes.to_vec();
        distinct.sort_unstable();
        distinct.dedup();
        let updates = distinct
            .iter()
            .map(|n| {
                Ok(ResourceUpdate {
                    name: self.marker(*n)?,
                    op: CapacityOp::Set(Capacity::Unbounded),
                    target: NodeSpec::Node(*n),
                })
            })
            .collect::<Result<Vec<_>, EslError>>()?;
        if !updates.is_empty() {
            cluster.set_resources(updates).await?;
        }
        nodes
            .iter()
            .map(|n| ResourceSpec::new().require(self.marker(*n)?, Amount::ONE))
            .collect()
    }

    /// Removes the markers of `nodes` (tasks holding one keep it until they end).
    pub(crate) async fn clear<C: ClusterApi>(
        &self,
        cluster: &C,
        nodes: &[NodeId],
    ) -> Result<(), EslError> {
        let updates = nodes
            .iter()
            .map(|n| {
                Ok(ResourceUpdate {
                    name: self.marker(*n)?,
                    op: CapacityOp::Delete,
                    target: every_node(),
                })
            })
            .collect::<Result<Vec<_>, EslError>>()?;
        if !updates.is_empty() {
            cluster.set_resources(updates).await?;
        }
        Ok(())
    }
}
