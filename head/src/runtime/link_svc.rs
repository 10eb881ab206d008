//! The `WorkerLink` gRPC service: registration, and one long-lived stream per worker, carrying
//! batches of messages both ways ([`Batches`]: what is queued when the stream can take more,
//! never held back by a timer). Only the leader serves workers; another replica answers "not
//! leader" with the leader's URL.

use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use escher_proto::NodeId;
use escher_proto::batch::Batches;
use escher_proto::convert::LinkEncoder;
use escher_proto::types::{RegisterRequest, WorkerMessage};
use escher_proto::wire::{self, worker_link_server::WorkerLink};
use tokio_stream::{Stream, StreamExt};
use tokio_util::task::TaskTracker;
use tonic::{Request, Response, Status, Streaming};

use super::handle::OwnerHandle;
use super::owner::Msg;

/// How long a new stream may take to say which node it belongs to.
const HELLO_TIMEOUT: Duration = Duration::from_secs(10);

/// Serves workers.
#[derive(Debug, Clone)]
pub(crate) struct LinkService {
    pub(crate) owner: OwnerHandle,
    pub(crate) tracker: TaskTracker,
}

static NEXT_CONN: AtomicU64 = AtomicU64::new(1);

type HeadStream = Pin<Box<dyn Stream<Item = Result<wire::HeadBatch, Status>> + Send>>;

#[tonic::async_trait]
impl WorkerLink for LinkService {
    async fn register(
        &self,
        request: Request<wire::RegisterRequest>,
    ) -> Result<Response<wire::RegisterReply>, Status> {
        let request: RegisterRequest = request.into_inner().try_into()?;
        let reply = self
            .owner
            .ask(|reply| Msg::Register { request, reply })
            .await??;
        Ok(Response::new(reply.into()))
    }

    type AttachStream = HeadStream;

    async fn attach(
        &self,
        request: Request<Streaming<wire::WorkerBatch>>,
    ) -> Result<Response<Self::AttachStream>, Status> {
        let mut inbound = request.into_inner();
        let first = tokio::time::timeout(HELLO_TIMEOUT, inbound.message())
            .await
            .map_err(|_| Status::deadline_exceeded("no Hello within 10 s of opening the stream"))??
            .ok_or_else(|| Status::invalid_argument("the stream closed before its Hello"))?;
        let mut first = first.messages.into_iter();
        let hello = first.next().ok_or_else(|| {
            Status::invalid_argument("the first batch on a worker stream is empty")
        })?;
        let (node, secret, interned_names) = match WorkerMessage::try_from(hello)? {
            WorkerMessage::Hello {
                node_id,
                secret,
                interned_names,
            } => (node_id, secret, interned_names),
            other => {
                return Err(Status::invalid_argument(format!(
                    "the first message on a worker stream must be Hello, not {other:?}"
                )));
            }
        };
        let conn = NEXT_CONN.fetch_add(1, Ordering::Relaxed);
        let (tx, rx) = super::workers::link_channel(super::workers::OUTBOX_BYTES);
        self.owner
            .ask(|reply| Msg::Attach {
                node,
                secret,
                conn,
                tx,
                reply,
            })
            .await??;
        let owner = self.owner.clone();
        // What came with the Hello is handled first, then each batch as one owner message.
        let mut batch: Vec<wire::WorkerMessage> = first.collect();
        self.tracker.spawn(async move {
            loop {
                let msgs = decode(node, batch);
                if !msgs.is_empty() && owner.tell(Msg::Worker { node, msgs }).await.is_err() {
                    break;
                }
                match inbound.message().await {
                    Ok(Some(next)) => batch = next.messages,
                    Ok(None) => break,
                    Err(status) => {
                        tracing::debug!(%node, %status, "worker stream ended with an error");
                        break;
                    }
                }
            }
            let _ = owner.tell(Msg::Detach { node, conn }).await;
        });
        // A worker that reads numbered names gets each resource name once on this stream.
        let mut names = LinkEncoder::new(interned_names);
        let outbound = Batches::new(rx.into_stream().map(move |msg| names.encode(msg)))
            .map(|messages| Ok(wire::HeadBatch { messages }));
        Ok(Response::new(Box::pin(outbound)))
    }
}

/// A batch's messages as domain values; a malformed one is logged and left out.
fn decode(node: NodeId, batch: Vec<wire::WorkerMessage>) -> Vec<WorkerMessage> {
    batch
        .into_iter()
        .filter_map(|msg| match WorkerMessage::try_from(msg) {
            Ok(msg) => Some(msg),
            Err(err) => {
                tracing::warn!(%node, %err, "ignoring a malformed worker message");
                None
            }
        })
        .collect()
}
