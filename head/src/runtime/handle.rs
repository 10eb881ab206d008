//! [`OwnerHandle`]: how gRPC handlers talk to the owner task, and how its answers become
//! gRPC statuses (the "not leader" status included).

use escher_proto::types::{MIG_REFUSAL_METADATA, RequestKey};
use tokio::sync::{mpsc, oneshot};
use tonic::Status;
use tonic::metadata::MetadataValue;

use super::owner::Msg;
use crate::auth::{Running, RunningAttempts};
use crate::replication::NotAccepted;
use crate::state::{ApplyError, ClusterState, Command, Reply};

/// The response metadata key that carries the leader's URL on a "not leader" answer.
pub const LEADER_METADATA: &str = "escher-leader";
/// The request metadata key with which a read accepts a possibly stale answer.
pub const READ_METADATA: &str = "escher-read";
/// The value of [`READ_METADATA`] that asks for a stale read.
pub const STALE: &str = "stale";

/// A cloneable sender to the owner task.
#[derive(Debug, Clone)]
pub(crate) struct OwnerHandle {
    tx: mpsc::Sender<Msg>,
}

fn gone() -> Status {
    Status::unavailable("the head is shutting down")
}

/// A read job: runs against the state once the read may be answered, or learns why not.
pub(crate) type Query = Box<dyn FnOnce(Result<&ClusterState, Status>) + Send>;

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

/// Maps a refused command to the gRPC status a client sees.
pub(crate) fn to_status(err: ApplyError) -> Status {
    let message = err.to_string();
    if let Some(refusal) = err.mig_refusal() {
        let mut status = if err.is_not_found() {
            Status::not_found(message)
        } else if err.is_precondition() {
            Status::failed_precondition(message)
        } else {
            Status::invalid_argument(message)
        };
        status.metadata_mut().insert(
            MIG_REFUSAL_METADATA,
            MetadataValue::from_static(refusal.as_str()),
        );
        return status;
    }
    match err {
        ApplyError::WrongSecret(_) | ApplyError::OtherNamespace { .. } => {
            Status::permission_denied(message)
        }
        ApplyError::Evicted(evicted) => evicted.into_status(),
        ApplyError::ObjectLost { id, node, .. } => {
            let mut status = Status::failed_precondition(message);
            let value = escher_proto::types::format_object_lost(id, node);
            if let Ok(value) = MetadataValue::try_from(value.as_str()) {
                status
                    .metadata_mut()
                    .insert(escher_proto::types::OBJECT_LOST_METADATA, value);
            }
            status
        }
        ApplyError::QuotaExceeded { .. }
        | ApplyError::ResourceQuotaExceeded { .. }
        | ApplyError::TaskTooLarge { .. }
        | ApplyError::SpecBytesExceeded { .. }
        | ApplyError::ObjectBytesExceeded { .. } => Status::resource_exhausted(message),
        ApplyError::AttemptEnded { .. } => Status::unauthenticated(message),
        ApplyError::ReservationExists(_) | ApplyError::ActorNameTaken { .. } => {
            Status::already_exists(message)
        }
        e if e.is_not_found() => Status::not_found(message),
        e if e.is_precondition() => Status::failed_precondition(message),
        _ => Status::invalid_argument(message),
    }
}

/// The answer of a replica that cannot take a write or a linearizable read: UNAVAILABLE, with
/// the `escher-leader` metadata entry: the leader's URL when it is known, empty otherwise.
pub(crate) fn not_accepted(why: NotAccepted) -> Status {
    match why {
        NotAccepted::NotLeader(Some(url)) => {
            let mut status = Status::unavailable(format!(
                "this head replica is not the leader; the leader is at {url}"
            ));
            if let Ok(value) = MetadataValue::try_from(url.as_str()) {
                status.metadata_mut().insert(LEADER_METADATA, value);
            }
            status
        }
        NotAccepted::NotLeader(None) => {
            let mut status = Status::unavailable(
                "this head replica is not the leader and no leader is known yet (an election \
                 is under way); try again shortly",
            );
            status
                .metadata_mut()
                .insert(LEADER_METADATA, MetadataValue::from_static(""));
            status
        }
        NotAccepted::Membership(why) => Status::failed_precondition(why),
        NotAccepted::DiskFull(why) => Status::resource_exhausted(format!(
            "this head replica refuses writes: {why}; writes resume by themselves once space is \
             freed"
        )),
    }
}

/// Whether a request accepts a possibly stale read.
pub(crate) fn wants_stale<T>(request: &tonic::Request<T>) -> bool {
    request
        .metadata()
        .get(READ_METADATA)
        .is_some_and(|v| v.as_bytes() == STALE.as_bytes())
}
