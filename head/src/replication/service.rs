//! The `Raft` gRPC service: what the other replicas of the group call on this one.
//!
//! A batch is checked before anything in it is parsed: it must name this replica's group and
//! this replica's id, or it is refused with FAILED_PRECONDITION and a message that says which
//! group and which replica this is (a mix-up of `--peers` lists, or a replica pointed at
//! another group's address). The messages are then parsed with raft's codec and handed to
//! the owner task on a channel of their own, so that peers' traffic never queues behind
//! clients' requests.

use escher_proto::types::HeadReplica;
use escher_proto::wire::{self, raft_server::Raft};
use protobuf::Message as _;
use raft::eraftpb::Message;
use tokio::sync::{mpsc, oneshot};
use tonic::{Request, Response, Status};

/// What the `Raft` service hands the owner task.
#[derive(Debug)]
pub(crate) enum Inbound {
    /// Raft messages from a peer.
    Messages {
        /// The sender's replica id.
        from: u64,
        /// The sender's address.
        from_address: String,
        /// The newest data format the sender reads (0: it did not say).
        data_format: u32,
        /// The messages, in order.
        messages: Vec<Message>,
    },
    /// A peer (or `escher heads` through another replica) asks how this replica is.
    Status {
        /// Where the answer goes.
        reply: oneshot::Sender<HeadReplica>,
    },
}

/// The `Raft` service of one replica.
#[derive(Debug, Clone)]
pub(crate) struct RaftService {
    id: u64,
    group: String,
    address: String,
    tx: mpsc::Sender<Inbound>,
}

impl RaftService {
    pub(crate) fn new(id: u64, group: &str, address: &str, tx: mpsc::Sender<Inbound>) -> Self {
        RaftService {
            id,
            group: group.to_string(),
            address: address.to_string(),
            tx,
        }
    }

    fn check_group(&self, group: &str) -> Result<(), Status> {
        if group == self.group {
            return Ok(());
        }
        Err(Status::failed_precondition(format!(
            "this head at {} is replica {} of group {:?}, not of group {group:?}; check the \
             --peers lists (and --group) of both replicas",
            self.address, self.id, self.group
        )))
    }
}

fn gone() -> Status {
    Status::unavailable("the head is shutting down")
}

#[tonic::async_trait]
impl Raft for RaftService {
    async fn send(
        &self,
        request: Request<wire::RaftBatch>,
    ) -> Result<Response<wire::RaftBatchReply>, Status> {
        let batch = request.into_inner();
        self.check_group(&batch.group)?;
        if batch.to != self.id {
            return Err(Status::failed_precondition(format!(
                "raft messages for replica {} reached replica {} of group {:?} at {}; replica {} \
                 has this address in its --peers list for the wrong id",
                batch.to, self.id, self.group, self.address, batch.from
            )));
        }
        if !escher_proto::convert::is_host_port(&batch.from_address) {
            return Err(Status::invalid_argument(format!(
                "from_address {:?} is not HOST:PORT",
                batch.from_address
            )));
        }
        let mut messages = Vec::with_capacity(batch.messages.len());
        for (i, bytes) in batch.messages.iter().enumerate() {
            let msg = Message::parse_from_bytes(bytes).map_err(|e| {
                Status::invalid_argument(format!("messages[{i}] is not a raft message: {e}"))
            })?;
            if msg.from != batch.from || msg.to != self.id {
                return Err(Status::invalid_argument(format!(
                    "messages[{i}] is from {} to {}, in a batch from {} to {}",
                    msg.from, msg.to, batch.from, self.id
                )));
            }
            messages.push(msg);
        }
        let inbound = Inbound::Messages {
            from: batch.from,
            from_address: batch.from_address,
            data_format: batch.data_format,
            messages,
        };
        self.tx.send(inbound).await.map_err(|_| gone())?;
        Ok(Response::new(wire::RaftBatchReply {}))
    }

    async fn status(
        &self,
        request: Request<wire::ReplicaStatusRequest>,
    ) -> Result<Response<wire::HeadReplica>, Status> {
        self.check_group(&request.into_inner().group)?;
        let (reply, rx) = oneshot::channel();
        self.tx
            .send(Inbound::Status { reply })
            .await
            .map_err(|_| gone())?;
        let status = rx.await.map_err(|_| gone())?;
        Ok(Response::new(status.into()))
    }
}
