//! Reaching the head: one attempt to register and attach ([`connect`]), and the attached
//! stream ([`Link`]).
//!
//! An attempt waits its back-off delay, calls `Register` on the replica believed to lead, then
//! opens `Attach` with `Hello` (node id and secret) already queued as the stream's first
//! message. Whatever fails is worth retrying at once elsewhere (a replica that does not lead
//! named the leader), worth retrying after a delay (the head is down, restarting, electing, or
//! answered nonsense: the next replica is tried), a sign that this worker's identity means
//! nothing to the head group (it registers as a new node), or fatal (the head refuses this
//! worker for a reason retrying will not fix); see [`ConnectError`].
//!
//! The outgoing half of the stream is an unbounded channel: the worker's event loop must never
//! wait on the network, and what it queues is bounded by what it runs (one `TaskStarted` and
//! one `TaskFinished` per task, one heartbeat per interval, one answer per log request). What
//! is queued when the stream can take more goes as one `WorkerBatch` ([`Batches`]).

use std::time::Duration;

use escher_proto::batch::Batches;
use escher_proto::convert::LinkDecoder;
use escher_proto::types::{RegisterReply, RegisterRequest, WorkerMessage};
use escher_proto::{NodeId, wire};
use tokio::sync::mpsc;
use tokio::time::{Instant, Interval, MissedTickBehavior};
use tokio_stream::StreamExt;
use tokio_stream::wrappers::UnboundedReceiverStream;
use tonic::{Code, Status, Streaming};

use crate::head_conn::{HeadConn, leader_hint};

/// How long `Register`, and then `Attach`, may take before the attempt counts as failed and
/// the next replica is tried: well under a lease, so that a worker whose replica froze finds
/// the new leader before its lease runs out.
const REGISTER_TIMEOUT: Duration = Duration::from_secs(2);

/// The largest message the worker accepts from the head (an assignment with large function
/// arguments), above gRPC's default of 4 MiB.
const MAX_HEAD_MESSAGE: usize = 64 * 1024 * 1024;

/// Why an attempt to reach the head failed.
#[derive(Debug)]
pub(crate) enum ConnectError {
    /// Try again after a back-off delay: the head is unreachable, restarting or confused.
    Retry(String),
    /// Try again at once: the replica asked named the leader (followed already).
    Redirected(String),
    /// Register again at once, with the same replica: it leads, and its answer to the attach
    /// was FAILED_PRECONDITION (the node was declared lost, or registered with an earlier
    /// leadership, whose messages for it are gone).
    RegisterAgain(String),
    /// The head group does not know this worker's identity (its state is gone, or the
    /// identity is another cluster's): register as a new node.
    Unknown(Status),
    /// Stop: the head refused this worker for a reason retrying will not fix.
    Fatal(Status),
}

/// The attached stream to the head, after a successful [`connect`].
#[derive(Debug)]
pub(crate) struct Link {
    /// The registration's answer: node id, cluster, and the secret of a new node.
    pub(crate) reply: RegisterReply,
    /// The node id the head gave this worker.
    pub(crate) node_id: NodeId,
    /// The outgoing half: what the worker sends.
    pub(crate) tx: mpsc::UnboundedSender<wire::WorkerMessage>,
    /// The incoming half: what the head sends, in batches.
    pub(crate) inbound: Streaming<wire::HeadBatch>,
    /// The resource names the head numbered on this stream.
    pub(crate) names: LinkDecoder,
    /// When to send the next heartbeat.
    pub(crate) heartbeat: Interval,
    /// When the registration was sent: the lease runs from then.
    pub(crate) registered_at: std::time::Instant,
    /// The lease period the head grants (half its heartbeat timeout), if it said.
    pub(crate) lease: Option<Duration>,
    /// The node's secret, as `Hello` presented it: the key of its data tickets derives from
    /// it.
    pub(crate) secret: String,
}

impl Link {
    /// Queues `msg`; gives it back if the stream is gone.
    pub(crate) fn send(&self, msg: WorkerMessage) -> Result<(), Option<WorkerMessage>> {
        // Converting back cannot fail for a message that was converted from a domain value.
        self.tx
            .send(msg.into())
            .map_err(|unsent| WorkerMessage::try_from(unsent.0).ok())
    }
}

/// What a failed call means for the attempt: follow a named leader, try the next replica,
/// start over as a new node, or stop.
fn failed(head: &HeadConn, call: &str, status: Status) -> ConnectError {
    if let Some(url) = leader_hint(&status) {
        head.follow(&url);
        return ConnectError::Redirected(url);
    }
    if status.code() == Code::NotFound {
        return ConnectError::Unknown(status);
    }
    if is_fatal(&status) {
        return ConnectError::Fatal(status);
    }
    if call == "attach" && status.code() == Code::FailedPrecondition {
        return ConnectError::RegisterAgain(format!("{call}: {}", status.message()));
    }
    head.rotate();
    ConnectError::Retry(format!("{call}: {status}"))
}

/// After `delay`, registers with `request` and attaches; `secret` is the secret of the
/// identity the request presents.
pub(crate) async fn connect(
    head: HeadConn,
    request: RegisterRequest,
    secret: Option<String>,
    delay: Duration,
) -> Result<Link, ConnectError> {
    tokio::time::sleep(delay).await;
    let registered_at = std::time::Instant::now();
    let mut client = head
        .link_client()
        .max_decoding_message_size(MAX_HEAD_MESSAGE);
    let register = client.register(wire::RegisterRequest::from(request));
    let reply = match tokio::time::timeout(REGISTER_TIMEOUT, register).await {
        Err(_) => {
            head.rotate();
            return Err(ConnectError::Retry(format!(
                "register: no answer within {REGISTER_TIMEOUT:?}"
            )));
        }
        Ok(Err(status)) => return Err(failed(&head, "register", status)),
        Ok(Ok(reply)) => reply.into_inner(),
    };
    let reply = RegisterReply::try_from(reply)
        .map_err(|e| ConnectError::Retry(format!("register: invalid reply: {e}")))?;

    let (tx, rx) = mpsc::unbounded_channel();
    let secret = reply.secret.clone().or(secret).unwrap_or_default();
    let hello = WorkerMessage::Hello {
        node_id: reply.node_id,
        secret: secret.clone(),
        interned_names: true,
    };
    // The receiver is alive: it is right here.
    let _ = tx.send(hello.into());
    let outbound = Batches::new(UnboundedReceiverStream::new(rx))
        .map(|messages| wire::WorkerBatch { messages });
    let inbound = match tokio::time::timeout(REGISTER_TIMEOUT, client.attach(outbound)).await {
        Err(_) => {
            head.rotate();
            return Err(ConnectError::Retry(format!(
                "attach: no answer within {REGISTER_TIMEOUT:?}"
            )));
        }
        Ok(Ok(response)) => response.into_inner(),
        Ok(Err(status)) => return Err(failed(&head, "attach", status)),
    };
    if let Some(timeout) = reply.heartbeat_timeout {
        crate::fence::set_timeout(timeout);
    }
    let lease = reply.heartbeat_timeout.map(crate::fence::lease_of);
    let interval = reply.heartbeat_interval;
    let mut heartbeat = tokio::time::interval_at(Instant::now() + interval, interval);
    heartbeat.set_missed_tick_behavior(MissedTickBehavior::Delay);
    Ok(Link {
        node_id: reply.node_id,
        reply,
        tx,
        inbound,
        names: LinkDecoder::new(),
        heartbeat,
        registered_at,
        lease,
        secret,
    })
}

/// Whether the head's answer means that trying again cannot help.
fn is_fatal(status: &Status) -> bool {
    matches!(
        status.code(),
        Code::InvalidArgument
            | Code::PermissionDenied
            | Code::Unauthenticated
            | Code::Unimplemented
    )
}
