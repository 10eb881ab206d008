//! How the owner's answers become gRPC statuses: a refused command ([`to_status`]), a replica
//! that cannot take a write or a linearizable read ([`not_accepted`], with the leader's URL in
//! the metadata), a write it had proposed and can no longer answer for ([`in_doubt`]), and
//! whether a request accepts a stale read ([`wants_stale`]). Used by the
//! gRPC handlers (through `handle`) and by the owner task alike, and depending on neither.

use escher_proto::types::MIG_REFUSAL_METADATA;
use tonic::Status;
use tonic::metadata::MetadataValue;

use crate::replication::NotAccepted;
use crate::state::ApplyError;

/// The response metadata key that carries the leader's URL on a "not leader" answer.
pub const LEADER_METADATA: &str = "escher-leader";
/// The request metadata key with which a read accepts a possibly stale answer.
pub const READ_METADATA: &str = "escher-read";
/// The value of [`READ_METADATA`] that asks for a stale read.
pub const STALE: &str = "stale";

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
        NotAccepted::ChangePending(why) => Status::aborted(why),
        NotAccepted::DiskFull(why) => Status::resource_exhausted(format!(
            "this head replica refuses writes: {why}; writes resume by themselves once space is \
             freed"
        )),
    }
}

/// The answer to a write this replica proposed to the group and can no longer answer for,
/// because of what `status` says (it stopped leading, stalled on a full disk, or is stopping)
/// before the write's entry committed: the entry is in the log of some replicas and may still
/// be committed by the next leader, or may never be. `status` with a message that says so and
/// the `escher-outcome` metadata entry, which the client reads as an open outcome
/// (`escher_proto::replicas::may_still_commit`); the `escher-leader` entry stays, so that a
/// caller follows the leader as after any "not leader".
pub(crate) fn in_doubt(status: &Status) -> Status {
    let message = format!(
        "{}; this replica had proposed the write before that and cannot tell whether it \
         commits: it may still be applied under the next leader (sending it again with the \
         same request key applies it at most once and answers with its outcome)",
        status.message()
    );
    let mut answer = Status::with_metadata(status.code(), message, status.metadata().clone());
    answer.metadata_mut().insert(
        escher_proto::replicas::OUTCOME_METADATA,
        MetadataValue::from_static(escher_proto::replicas::MAY_STILL_COMMIT),
    );
    answer
}

/// Whether a request accepts a possibly stale read.
pub(crate) fn wants_stale<T>(request: &tonic::Request<T>) -> bool {
    request
        .metadata()
        .get(READ_METADATA)
        .is_some_and(|v| v.as_bytes() == STALE.as_bytes())
}
