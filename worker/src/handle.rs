//! [`WorkerHandle`]: watching a worker from outside while it runs, for instance to learn its
//! node id once the head has registered it (what an in-process `LocalCluster` waits for).

use escher_proto::NodeId;
use tokio::sync::watch;

/// A cheap, cloneable view of a running (or not yet running) [`Worker`](crate::Worker).
#[derive(Debug, Clone)]
pub struct WorkerHandle {
    pub(crate) node_id: watch::Receiver<Option<NodeId>>,
}

impl WorkerHandle {
    /// The node id of the worker's latest registration, if it has registered.
    pub fn node_id(&self) -> Option<NodeId> {
        *self.node_id.borrow()
    }

    /// Waits until the worker has registered, and returns its node id; `None` if the worker
    /// stopped (or was dropped) first.
    pub async fn registered(&mut self) -> Option<NodeId> {
        match self.node_id.wait_for(Option::is_some).await {
            Ok(id) => *id,
            Err(_) => None,
        }
    }

    /// A receiver that sees every change of node id (a new registration after the head forgot
    /// this worker gives a new one).
    pub fn subscribe(&self) -> watch::Receiver<Option<NodeId>> {
        self.node_id.clone()
    }
}
