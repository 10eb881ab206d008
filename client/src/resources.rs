//! The ephemeral-resource API of [`Client`] (docs/DESIGN.md §3): `set_resource` and its variants,
//! the batch form, and `cluster_status`.
//!
//! Each change goes to the head as a [`ResourceUpdate`] with a [`NodeSpec`] target; the head
//! resolves the target to nodes, applies the change as a delta at its single serialization
//! point, and answers with the nodes it changed. `NodeSpec::Local` is resolved by the head
//! from `caller_task`, so the client refuses it before sending when it speaks for no task.
//! Single updates made concurrently on one client share calls (`resource_updates.rs`); each
//! is still answered or refused on its own.

use escher_proto::convert::Problem;
use escher_proto::types::{SetResourceOutcome, SetResourcesReply, SetResourcesRequest};
use escher_proto::{ClusterStatus, ConvertError, NodeId, NodeSpec, ResourceUpdate, wire};

use crate::args::{IntoCapacity, IntoDelta, IntoResourceName};
use crate::resource_updates::{Job, nodes_of_one, updater_gone};
use crate::{Client, ClientError, ResourceUpdateExt};

impl Client {
    /// Creates or resizes resource `name` to `capacity` on the nodes `target` selects (a
    /// capacity of 0 deletes it); returns the nodes changed, in ascending id order.
    ///
    /// Concurrent single updates on one client (`set_resource`, `adjust_resource`,
    /// `delete_resource` from many futures or threads) share calls to the head, so creating
    /// many resources at once costs about as much as one [`set_resources`](Self::set_resources);
    /// each call still succeeds or fails on its own.
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

    /// One update, coalesced with the single updates other futures make meanwhile (see the
    /// `resource_updates` module).
    async fn update_one(&self, update: ResourceUpdate) -> Result<Vec<NodeId>, ClientError> {
        if update.target == NodeSpec::Local {
            self.require_caller()?;
        }
        let (reply, answer) = tokio::sync::oneshot::channel();
        match self.updater().send(Job { update, reply }) {
            Ok(()) => answer.await.map_err(|_| updater_gone())?,
            // The updater is gone (its runtime stopped): send directly.
            Err(tokio::sync::mpsc::error::SendError(job)) => {
                Ok(nodes_of_one(self.set_resources(vec![job.update]).await?))
            }
        }
    }

    /// Applies many resource changes in one call, in order, all or none; returns one outcome
    /// (the nodes changed) per update.
    pub async fn set_resources(
        &self,
        updates: Vec<ResourceUpdate>,
    ) -> Result<Vec<SetResourceOutcome>, ClientError> {
        if updates.is_empty() {
            return Ok(Vec::new());
        }
        if updates.iter().any(|u| u.target == NodeSpec::Local) {
            self.require_caller()?;
        }
        let request = SetResourcesRequest {
            updates,
            namespace: self.namespace().cloned(),
            caller_task: self.caller_task(),
        };
        self.send_set_resources(&mut wire::SetResourcesRequest::from(request))
            .await
    }

    /// Sends `request` under a new key (held until it is answered) and checks that the reply
    /// holds one outcome per update. The request is left as it was sent, for a caller that
    /// splits it after a refusal.
    pub(crate) async fn send_set_resources(
        &self,
        request: &mut wire::SetResourcesRequest,
    ) -> Result<Vec<SetResourceOutcome>, ClientError> {
        let ticket = self.ticket();
        request.key = Some(ticket.key().into());
        self.check_size("set_resources", request)?;
        let reply = self
            .call_write("set_resources", Some(ticket.key()), false, |mut rpc| {
                let request = request.clone();
                async move { rpc.set_resources(request).await }
            })
            .await?;
        let reply = SetResourcesReply::from(reply);
        if reply.outcomes.len() != request.updates.len() {
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
