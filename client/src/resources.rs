//! The ephemeral-resource API of [`Client`] (DESIGN §3): `set_resource` and its variants,
//! the batch form, and `cluster_status`.
//!
//! Each change goes to the head as a [`ResourceUpdate`] with a [`NodeSpec`] target; the head
//! resolves the target to nodes, applies the change as a delta at its single serialization
//! point, and answers with the nodes it changed. `NodeSpec::Local` is resolved by the head
//! from `caller_task`, so the client refuses it before sending when it speaks for no task.

use escher_proto::convert::Problem;
use escher_proto::types::{SetResourceOutcome, SetResourcesReply, SetResourcesRequest};
use escher_proto::{ClusterStatus, ConvertError, NodeId, NodeSpec, ResourceUpdate, wire};

use crate::args::{IntoCapacity, IntoDelta, IntoResourceName};
use crate::{Client, ClientError, ResourceUpdateExt};

impl Client {
    /// Creates or resizes resource `name` to `capacity` on the nodes `target` selects (a
    /// capacity of 0 deletes it); returns the nodes changed, in ascending id order.
    ///
    /// ```no_run
    /// # async fn demo(client: escher_client::Client) -> Result<(), escher_client::ClientError> {
    /// use escher_proto::{NodeId, NodeSpec};
    /// client.set_resource("dataset-a", "unbounded", NodeSpec::Node(NodeId(3))).await?;
    /// client.set_resource("queue", 4, NodeSpec::Local).await?; // inside a task only
    /// # Ok(()) }
    /// ```
    pub async fn set_resource(
        &self,
        name: impl IntoResourceName,
        capacity: impl IntoCapacity,
        target: NodeSpec,
    ) -> Result<Vec<NodeId>, ClientError> {
        self.update_one(ResourceUpdate::set(name, capacity, target)?)
            .await
    }

    /// Changes the capacity of `name` by `delta` (`1`, `-2`, `"+0.5"`) on the nodes `target`
    /// selects, creating it from zero if absent; reaching zero deletes it. Concurrent
    /// adjustments never lose each other. Returns the nodes changed.
    pub async fn adjust_resource(
        &self,
        name: impl IntoResourceName,
        delta: impl IntoDelta,
        target: NodeSpec,
    ) -> Result<Vec<NodeId>, ClientError> {
        self.update_one(ResourceUpdate::adjust(name, delta, target)?)
            .await
    }

    /// Deletes `name` on the nodes `target` selects; tasks holding it keep it until they
    /// finish. Returns the nodes changed.
    pub async fn delete_resource(
        &self,
        name: impl IntoResourceName,
        target: NodeSpec,
    ) -> Result<Vec<NodeId>, ClientError> {
        self.update_one(ResourceUpdate::delete(name, target)?).await
    }

    async fn update_one(&self, update: ResourceUpdate) -> Result<Vec<NodeId>, ClientError> {
        let mut outcomes = self.set_resources(vec![update]).await?;
        Ok(outcomes.pop().map(|o| o.nodes).unwrap_or_default())
    }

    /// Applies many resource changes in one call, in order; returns one outcome (the nodes
    /// changed) per update.
    pub async fn set_resources(
        &self,
        updates: Vec<ResourceUpdate>,
    ) -> Result<Vec<SetResourceOutcome>, ClientError> {
        if updates.is_empty() {
            return Ok(Vec::new());
        }
        let local = updates.iter().any(|u| u.target == NodeSpec::Local);
        let caller_task = if local {
            Some(self.require_caller()?)
        } else {
            self.caller_task()
        };
        let count = updates.len();
        let request = SetResourcesRequest {
            updates,
            namespace: self.namespace().cloned(),
            caller_task,
        };
        let ticket = self.ticket();
        let mut request = wire::SetResourcesRequest::from(request);
        request.key = Some(ticket.key().into());
        self.check_size("set_resources", &request)?;
        let reply = self
            .call(|mut rpc| {
                let request = request.clone();
                async move { rpc.set_resources(request).await }
            })
            .await?;
        let reply = SetResourcesReply::from(reply);
        if reply.outcomes.len() != count {
            let why = Problem::Rule("does not hold one outcome per update");
            return Err(ConvertError::new("outcomes", why).into());
        }
        Ok(reply.outcomes)
    }

    /// Every node the head knows (live or not) with its labels and, per resource, its total
    /// and what running tasks use; and how many tasks are pending and running.
    pub async fn cluster_status(&self) -> Result<ClusterStatus, ClientError> {
        self.cluster_status_of(false).await
    }

    /// The cluster status with [`ClusterStatus::namespaces`] filled in: the tasks the head
    /// keeps, counted by namespace and state (one pass over every task on the head, so meant
    /// for views like `escher top`, not for every call).
    pub async fn cluster_status_with_task_counts(&self) -> Result<ClusterStatus, ClientError> {
        self.cluster_status_of(true).await
    }

    async fn cluster_status_of(&self, task_counts: bool) -> Result<ClusterStatus, ClientError> {
        let reply = self
            .call(|mut rpc| async move {
                rpc.cluster_status(self.read(wire::ClusterStatusRequest { task_counts }))
                    .await
            })
            .await?;
        Ok(ClusterStatus::try_from(reply)?)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn local_targets_need_a_running_task() {
        // Nothing listens on port 1: the error must come from the client, before sending.
        let client = Client::connect_lazy("http://127.0.0.1:1")
            .unwrap()
            .without_caller_task();
        let err = client
            .set_resource("queue", 1, NodeSpec::Local)
            .await
            .unwrap_err();
        assert!(matches!(err, ClientError::Usage(_)), "{err:?}");
        assert_eq!(
            err.to_string(),
            "a local target (--local) is only valid inside a running task (ESCHER_TASK_ID is not set)"
        );
        let err = client
            .adjust_resource("b@d", 1, NodeSpec::Local)
            .await
            .unwrap_err();
        assert!(matches!(err, ClientError::Invalid(_)), "{err:?}");
        assert!(client.set_resources(vec![]).await.unwrap().is_empty());
    }
}
