//! [`OwnerHandle`]: how gRPC handlers talk to the owner task. How its answers become gRPC
//! statuses is `statuses`, which the owner uses too (so neither module imports the other's
//! caller).

use escher_proto::types::RequestKey;
use tokio::sync::{mpsc, oneshot};
use tonic::Status;

use super::owner::Msg;
use super::reads::Query;
pub use super::statuses::{LEADER_METADATA, READ_METADATA, STALE};
pub(crate) use super::statuses::{to_status, wants_stale};
use crate::auth::{Running, RunningAttempts};
use crate::state::{ClusterState, Command, Reply};

/// A cloneable sender to the owner task.
#[derive(Debug, Clone)]
pub(crate) struct OwnerHandle {
    tx: mpsc::Sender<Msg>,
}

fn gone() -> Status {
    Status::unavailable("the head is shutting down")
}

impl OwnerHandle {
    pub(crate) fn new(tx: mpsc::Sender<Msg>) -> OwnerHandle {
        OwnerHandle { tx }
    }

    /// Sends a message built around a reply channel and awaits the reply.
    pub(crate) async fn ask<T>(
        &self,
        build: impl FnOnce(oneshot::Sender<T>) -> Msg,
    ) -> Result<T, Status> {
        let (reply, rx) = oneshot::channel();
        self.tx.send(build(reply)).await.map_err(|_| gone())?;
        rx.await.map_err(|_| gone())
    }

    /// Applies a command through the replicated log; answers once it is committed and
    /// applied.
    pub(crate) async fn apply(
        &self,
        command: Command,
        key: Option<RequestKey>,
    ) -> Result<Reply, Status> {
        self.ask(|reply| Msg::Apply {
            command,
            key,
            reply,
        })
        .await?
    }

    /// Runs a read-only query against the state: linearizable (on the leader, after raft
    /// confirms it leads), or, with `stale`, at once against this replica's copy.
    pub(crate) async fn read<T: Send + 'static>(
        &self,
        stale: bool,
        query: impl FnOnce(&ClusterState) -> T + Send + 'static,
    ) -> Result<T, Status> {
        self.ask(|reply| {
            let job: Query = Box::new(move |state| {
                let _ = reply.send(state.map(query));
            });
            Msg::Read { job, stale }
        })
        .await?
    }

    /// Sends a message that needs no reply.
    pub(crate) async fn tell(&self, msg: Msg) -> Result<(), Status> {
        self.tx.send(msg).await.map_err(|_| gone())
    }
}

/// The auth layer asks the owner whether a task credential's attempt runs: one stale read
/// (this replica's state as applied; the attempt that ended cannot come back).
impl RunningAttempts for OwnerHandle {
    fn running(&self, task: escher_proto::types::TaskId, attempt: u32) -> Running {
        let owner = self.clone();
        Box::pin(async move {
            owner
                .read(true, move |s| s.running_attempt(task, attempt).map(|_| ()))
                .await
        })
    }
}
