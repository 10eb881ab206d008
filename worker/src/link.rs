//! Reaching the head: one attempt to register and attach ([`connect`]), and the attached
//! stream ([`Link`]).
//!
//! An attempt waits its back-off delay, calls `Register`, then opens `Attach` with `Hello`
//! already queued as the stream's first message. Whatever fails is either worth retrying
//! (the head is down, restarting, or answered nonsense) or fatal (the head refuses this
//! worker for a reason retrying will not fix); see [`ConnectError`].
//!
//! The outgoing half of the stream is an unbounded channel: the worker's event loop must never
//! wait on the network, and what it queues is bounded by what it runs (one `TaskStarted` and
//! one `TaskFinished` per task, one heartbeat per interval, one answer per log request).

use std::time::Duration;

use escher_proto::types::{RegisterReply, RegisterRequest, WorkerMessage};
use escher_proto::{NodeId, wire};
use tokio::sync::mpsc;
use tokio::time::{Instant, Interval, MissedTickBehavior};
use tokio_stream::wrappers::UnboundedReceiverStream;
use tonic::{Code, Status, Streaming};

use crate::head_conn::HeadConn;

/// How long `Register` may take before the attempt counts as failed.
const REGISTER_TIMEOUT: Duration = Duration::from_secs(10);

/// The largest message the worker accepts from the head (an assignment with large function
/// arguments), above gRPC's default of 4 MiB.
const MAX_HEAD_MESSAGE: usize = 64 * 1024 * 1024;

/// Why an attempt to reach the head failed.
#[derive(Debug)]
pub(crate) enum ConnectError {
    /// Try again after a back-off delay: the head is unreachable, restarting or confused.
    Retry(String),
    /// Stop: the head refused this worker for a reason retrying will not fix.
    Fatal(Status),
}

/// The attached stream to the head, after a successful [`connect`].
#[derive(Debug)]
pub(crate) struct Link {
    /// The node id the head gave this worker.
    pub(crate) node_id: NodeId,
    /// The outgoing half: what the worker sends.
    pub(crate) tx: mpsc::UnboundedSender<wire::WorkerMessage>,
    /// The incoming half: what the head sends.
    pub(crate) inbound: Streaming<wire::HeadMessage>,
    /// When to send the next heartbeat.
    pub(crate) heartbeat: Interval,
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

/// After `delay`, registers with `request` and attaches.
pub(crate) async fn connect(
    head: HeadConn,
    request: RegisterRequest,
    delay: Duration,
) -> Result<Link, ConnectError> {
    tokio::time::sleep(delay).await;
    let mut client = head
        .link_client()
        .max_decoding_message_size(MAX_HEAD_MESSAGE);
    let register = client.register(wire::RegisterRequest::from(request));
    let reply = match tokio::time::timeout(REGISTER_TIMEOUT, register).await {
        Err(_) => {
            return Err(ConnectError::Retry(format!(
                "register: no answer within {REGISTER_TIMEOUT:?}"
            )));
        }
        Ok(Err(status)) if is_fatal(&status) => return Err(ConnectError::Fatal(status)),
        Ok(Err(status)) => return Err(ConnectError::Retry(format!("register: {status}"))),
        Ok(Ok(reply)) => reply.into_inner(),
    };
    let reply = RegisterReply::try_from(reply)
        .map_err(|e| ConnectError::Retry(format!("register: invalid reply: {e}")))?;

    let (tx, rx) = mpsc::unbounded_channel();
    let hello = WorkerMessage::Hello {
        node_id: reply.node_id,
    };
    // The receiver is alive: it is right here.
    let _ = tx.send(hello.into());
    let inbound = match client.attach(UnboundedReceiverStream::new(rx)).await {
        Ok(response) => response.into_inner(),
        Err(status) if is_fatal(&status) => return Err(ConnectError::Fatal(status)),
        Err(status) => return Err(ConnectError::Retry(format!("attach: {status}"))),
    };
    let interval = reply.heartbeat_interval;
    let mut heartbeat = tokio::time::interval_at(Instant::now() + interval, interval);
    heartbeat.set_missed_tick_behavior(MissedTickBehavior::Delay);
    Ok(Link {
        node_id: reply.node_id,
        tx,
        inbound,
        heartbeat,
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
