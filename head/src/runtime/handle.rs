//! [`OwnerHandle`]: how gRPC handlers talk to the owner task, and how its errors become
//! gRPC statuses.

use tokio::sync::{mpsc, oneshot};
use tonic::Status;

use super::owner::Msg;
use crate::state::{ApplyError, ClusterState, Command, Reply};

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

    /// Applies a command.
    pub(crate) async fn apply(&self, command: Command) -> Result<Reply, Status> {
        self.ask(|reply| Msg::Apply { command, reply })
            .await?
            .map_err(to_status)
    }

    /// Runs a read-only query against the state.
    pub(crate) async fn read<T: Send + 'static>(
        &self,
        query: impl FnOnce(&ClusterState) -> T + Send + 'static,
    ) -> Result<T, Status> {
        self.ask(|reply| {
            Msg::Read(Box::new(move |state| {
                let _ = reply.send(query(state));
            }))
        })
        .await
    }

    /// Sends a message that needs no reply.
    pub(crate) async fn tell(&self, msg: Msg) -> Result<(), Status> {
        self.tx.send(msg).await.map_err(|_| gone())
    }
}

/// Maps a refused command to the gRPC status a client sees.
pub(crate) fn to_status(err: ApplyError) -> Status {
    let message = err.to_string();
    match err {
        ApplyError::Evicted(evicted) => evicted.into_status(),
        e if e.is_not_found() => Status::not_found(message),
        e if e.is_precondition() => Status::failed_precondition(message),
        _ => Status::invalid_argument(message),
    }
}
