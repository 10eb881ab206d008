//! The `Actors` service on the worker's data-plane listener: callers' streams of method calls,
//! checked against the data ticket the head signed, queued to the incarnation in the order
//! each caller sent them, answered as they end (docs/ARCHITECTURE.md "The path of a call").
//!
//! A stream opens with the actor, its incarnation and a ticket. The ticket must be signed
//! with this node's ticket key, name this node, this actor and this incarnation, be unexpired
//! and belong to the incarnation's namespace: otherwise the stream is refused (UNAUTHENTICATED
//! for a ticket that does not verify, NOT_FOUND for an actor this worker does not host in that
//! incarnation, so that the caller resolves it again). Calls are then queued at once, in
//! order, without waiting for earlier ones to end (pipelining); answers go back in batches of
//! whatever has ended.
//!
//! A call that names a result object (`ActorCall.result_object`, an id of its caller's object
//! session) and returns more than [`INLINE_RESULT_BYTES`] (100 KiB, a task's threshold) has its
//! result sealed in this node's store as that object before it is answered, and is answered
//! `kept` (its size, CRC-32C and this node) instead of with the bytes: the caller has the head
//! record the copy and owns it as it owns a put, and whoever reads it fetches it from here,
//! worker to worker or worker to client. A result that cannot be kept (the store cannot take
//! it, the id is held already) is answered inline, as it is when no object is named.

use std::collections::HashMap;
use std::pin::Pin;
use std::sync::Arc;

use escher_proto::TaskId;
use escher_proto::types::{DataTicket, INLINE_RESULT_BYTES, ObjectId};
use escher_proto::wire::{self, actor_reply, actors_server::Actors};
use futures_util::stream::FuturesUnordered;
use tokio::sync::{mpsc, oneshot};
use tokio_stream::{Stream, StreamExt};
use tonic::{Request, Response, Status, Streaming};

use super::host::{ActorHost, CANCELLED_QUEUED, Call, CallControl, CallOutcome, Live, Pending};
use crate::objects::NodeObjects;
use crate::objects::result::keep_call_result;

/// The most calls one stream may have queued and unanswered; past it, the stream's calls wait
/// to be read (HTTP/2 flow control pushes back on the caller).
const MAX_IN_FLIGHT: usize = 4096;

/// The `Actors` service of one worker.
#[derive(Debug, Clone)]
pub struct ActorService {
    host: Arc<ActorHost>,
    /// This node's objects, where large results are kept (none: every result inline).
    objects: Option<NodeObjects>,
}

impl ActorService {
    /// The service over `host`; every result is answered inline until
    /// [`with_objects`](Self::with_objects) gives it a store.
    pub fn new(host: Arc<ActorHost>) -> ActorService {
        ActorService {
            host,
            objects: None,
        }
    }

    /// Keeps results above [`INLINE_RESULT_BYTES`] of calls that name a result object in
    /// `objects` (this node's store).
    pub fn with_objects(mut self, objects: NodeObjects) -> ActorService {
        self.objects = Some(objects);
        self
    }

    /// The live incarnation `open` may call, or why not.
    fn admit(&self, open: &wire::ActorCallOpen) -> Result<Live, Status> {
        let Some((node, key)) = self.host.key() else {
            return Err(Status::unavailable(
                "this worker is not attached to the head yet; resolve the actor again",
            ));
        };
        let ticket = DataTicket::verify(&open.ticket, &key).ok_or_else(|| {
            Status::unauthenticated(
                "the data ticket is not valid on this worker (it was signed for another node, \
                 or has been changed); resolve the actor again for a fresh one",
            )
        })?;
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_millis() as u64);
        if ticket.node != node
            || ticket.actor.0 != open.actor
            || ticket.incarnation != open.incarnation
        {
            return Err(Status::unauthenticated(
                "the data ticket is for another actor, incarnation or node than the stream \
                 names; resolve the actor again",
            ));
        }
        if ticket.expiry_ms < now {
            return Err(Status::unauthenticated(
                "the data ticket has expired; resolve the actor again for a fresh one",
            ));
        }
        let live = self
            .host
            .live(TaskId(open.actor))
            .filter(|l| l.incarnation == open.incarnation)
            .ok_or_else(|| {
                Status::not_found(format!(
                    "actor {} incarnation {} is not served here (it ended or moved); resolve \
                     it again",
                    open.actor, open.incarnation
                ))
            })?;
        if live.namespace != ticket.namespace {
            return Err(Status::unauthenticated(
                "the data ticket is for another namespace than the actor's",
            ));
        }
        Ok(live)
    }
}

type ReplyStream = Pin<Box<dyn Stream<Item = Result<wire::ActorReplyBatch, Status>> + Send>>;

#[tonic::async_trait]
impl Actors for ActorService {
    type CallsStream = ReplyStream;

    async fn calls(
        &self,
        request: Request<Streaming<wire::ActorCallBatch>>,
    ) -> Result<Response<Self::CallsStream>, Status> {
        let mut inbound = request.into_inner();
        let first = match inbound.next().await {
            Some(Ok(batch)) => batch,
            Some(Err(status)) => return Err(status),
            None => {
                return Err(Status::invalid_argument(
                    "the call stream ended before it opened",
                ));
            }
        };
        let open = first.open.as_ref().ok_or_else(|| {
            Status::invalid_argument(
                "the first message of a call stream names the actor and carries its ticket",
            )
        })?;
        let live = self.admit(open)?;
        let (out_tx, out_rx) = mpsc::channel::<Result<wire::ActorReplyBatch, Status>>(64);
        let keeper = self
            .objects
            .clone()
            .zip(self.host.key().map(|(node, _)| node.0))
            .map(|(objects, node)| Keeper { objects, node });
        tokio::spawn(pump(live, first, inbound, out_tx, keeper));
        let stream = tokio_stream::wrappers::ReceiverStream::new(out_rx);
        Ok(Response::new(Box::pin(stream)))
    }
}

/// Queues the stream's calls in order and sends their answers as they end, until the caller
/// closes the stream and every call has been answered, or the incarnation ends.
async fn pump(
    live: Live,
    first: wire::ActorCallBatch,
    mut inbound: Streaming<wire::ActorCallBatch>,
    out: mpsc::Sender<Result<wire::ActorReplyBatch, Status>>,
    keeper: Option<Keeper>,
) {
    let mut pending: FuturesUnordered<_> = FuturesUnordered::new();
    let mut open = true;
    let mut last_seq = 0u64;
    // The calls queued or running, by seq: what a cancel reaches.
    let mut controls: HashMap<u64, Arc<CallControl>> = HashMap::new();
    let enqueue = |calls: Vec<wire::ActorCall>,
                   last_seq: &mut u64,
                   controls: &mut HashMap<u64, Arc<CallControl>>| {
        let mut waits: Vec<Wait> = Vec::with_capacity(calls.len());
        for call in calls {
            let seq = call.seq;
            if seq <= *last_seq {
                let outcome = CallOutcome::Error(format!(
                    "call {seq} came after call {}: calls on a stream are numbered in the order \
                     sent",
                    *last_seq
                ));
                waits.push(answered(seq, outcome));
                continue;
            }
            *last_seq = seq;
            // Where a large result goes, when the caller named an object and this node has a
            // store.
            let keep = keeper.clone().zip(call.result_object.map(ObjectId::from));
            let (tx, rx) = oneshot::channel();
            // Counted until answered (or until nobody waits for the answer any more).
            let counted = Pending::new(&live);
            let control = Arc::new(CallControl::default());
            let queued = Call {
                method: call.method,
                args: call.args,
                reply: tx,
                control: Arc::clone(&control),
            };
            if live.calls.send(queued).is_err() {
                waits.push(answered(seq, CallOutcome::Died(live.why())));
                continue;
            }
            controls.insert(seq, Arc::clone(&control));
            let why = Arc::clone(&live.why);
            let namespace = live.namespace.clone();
            waits.push(Box::pin(async move {
                let _counted = counted;
                let cancelled = CallOutcome::Cancelled(CANCELLED_QUEUED.into());
                let mut rx = rx;
                let answer = tokio::select! {
                    answer = &mut rx => answer,
                    // Cancelled: answered at once if it had not started (the loop that starts
                    // calls skips it); a started one is answered when it ends.
                    () = control.token.cancelled() => {
                        if control.cancelled_unstarted() {
                            return (seq, cancelled);
                        }
                        rx.await
                    }
                };
                let outcome = answer.unwrap_or_else(|_| {
                    if control.cancelled_unstarted() {
                        return cancelled;
                    }
                    CallOutcome::Died(
                        why.lock()
                            .unwrap_or_else(|e| e.into_inner())
                            .clone()
                            .unwrap_or_else(|| "the actor ended".into()),
                    )
                });
                let outcome = match (outcome, keep) {
                    (CallOutcome::Returned(bytes), Some((keeper, id)))
                        if bytes.len() > INLINE_RESULT_BYTES =>
                    {
                        keeper.keep(id, namespace, bytes).await
                    }
                    (outcome, _) => outcome,
                };
                (seq, outcome)
            }));
        }
        waits
    };
    for wait in enqueue(first.calls, &mut last_seq, &mut controls) {
        pending.push(wait);
    }
    cancel(&controls, &first.cancel);
    loop {
        if !open && pending.is_empty() {
            break;
        }
        tokio::select! {
            batch = inbound.next(), if open && pending.len() < MAX_IN_FLIGHT => match batch {
                Some(Ok(batch)) => {
                    for wait in enqueue(batch.calls, &mut last_seq, &mut controls) {
                        pending.push(wait);
                    }
                    cancel(&controls, &batch.cancel);
                }
                // The caller closed its side, or went away: answer what is queued.
                Some(Err(_)) | None => open = false,
            },
            Some((seq, outcome)) = pending.next(), if !pending.is_empty() => {
                controls.remove(&seq);
                let mut replies = vec![reply(seq, outcome)];
                // Whatever else has ended goes in the same batch.
                while let Some(Some((seq, outcome))) = futures_util::FutureExt::now_or_never(pending.next()) {
                    controls.remove(&seq);
                    replies.push(reply(seq, outcome));
                }
                if out.send(Ok(wire::ActorReplyBatch { replies })).await.is_err() {
                    // The caller is gone: nobody reads the answers.
                    return;
                }
            }
        }
    }
}

/// Cancels the calls `seqs` names that are queued or running; others (unknown, answered) are
/// ignored.
fn cancel(controls: &HashMap<u64, Arc<CallControl>>, seqs: &[u64]) {
    for seq in seqs {
        if let Some(control) = controls.get(seq) {
            control.cancel();
        }
    }
}

type Wait = Pin<Box<dyn std::future::Future<Output = (u64, CallOutcome)> + Send>>;

fn answered(seq: u64, outcome: CallOutcome) -> Wait {
    Box::pin(async move { (seq, outcome) })
}

fn reply(seq: u64, outcome: CallOutcome) -> wire::ActorReply {
    let outcome = match outcome {
        CallOutcome::Returned(bytes) => actor_reply::Outcome::Returned(bytes),
        CallOutcome::Error(why) => actor_reply::Outcome::Error(why),
        CallOutcome::Died(why) => actor_reply::Outcome::Died(why),
        CallOutcome::Cancelled(why) => actor_reply::Outcome::Cancelled(why),
        CallOutcome::Kept { size, crc32c, node } => {
            actor_reply::Outcome::Kept(wire::KeptResult { size, crc32c, node })
        }
    };
    wire::ActorReply {
        seq,
        outcome: Some(outcome),
    }
}

/// Keeps large results in this node's store: its objects, and the node's id (which the answer
/// names).
#[derive(Debug, Clone)]
struct Keeper {
    objects: NodeObjects,
    node: u64,
}

impl Keeper {
    /// `bytes` kept as object `id` of `namespace`: [`CallOutcome::Kept`], or, where the store
    /// cannot keep it, the bytes inline.
    async fn keep(
        self,
        id: ObjectId,
        namespace: Option<String>,
        bytes: bytes::Bytes,
    ) -> CallOutcome {
        let Keeper { objects, node } = self;
        let inline = bytes.clone();
        let kept =
            tokio::task::spawn_blocking(move || keep_call_result(&objects, id, namespace, &bytes))
                .await;
        match kept {
            Ok(Ok((size, crc32c))) => CallOutcome::Kept { size, crc32c, node },
            Ok(Err(why)) => {
                tracing::debug!(object = %id, %why, "an actor call's result goes back inline");
                CallOutcome::Returned(inline)
            }
            Err(e) => {
                tracing::warn!(object = %id, error = %e, "keeping an actor call's result failed");
                CallOutcome::Returned(inline)
            }
        }
    }
}
