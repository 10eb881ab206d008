//! [`Transport`]: raft messages to the other replicas, over the `Raft` gRPC service of their
//! head port.
//!
//! Each peer has a bounded queue and one task that drains it: it takes whatever is queued (up
//! to [`MAX_BATCH`] messages, a snapshot alone), encodes each message with raft's own codec
//! (rust-protobuf), and sends them as one `RaftBatch` call tagged with the group id, the
//! sender and the receiver. Nothing here retries a message: raft resends what matters. So:
//!
//! - a full queue drops the message (a peer that cannot keep up must not hold the leader's
//!   memory), and raft is told the peer is unreachable;
//! - a failed call drops its batch, tells raft (`report_unreachable`, and `report_snapshot`
//!   for a snapshot), and waits a back-off (doubling from [`BACKOFF_MIN`] to [`BACKOFF_MAX`])
//!   before the next call; tonic reconnects the channel by itself.
//!
//! The owner task learns of failures through [`TransportEvent`]s, since only it may touch the
//! raft node.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use backon::{BackoffBuilder, ExponentialBuilder};
use escher_proto::access::Bearer;
use escher_proto::wire::{self, raft_client::RaftClient};
use protobuf::Message as _;
use raft::eraftpb::{Message, MessageType};
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;
use tonic::service::interceptor::InterceptedService;
use tonic::transport::{Channel, Endpoint};

/// Messages queued per peer before new ones are dropped.
pub const QUEUE: usize = 4096;
/// The most messages in one `RaftBatch`.
pub const MAX_BATCH: usize = 256;
/// The largest `RaftBatch` either side accepts (a snapshot travels in one).
pub const MAX_RAFT_MESSAGE: usize = 512 * 1024 * 1024;
/// The first wait after a failed call.
pub const BACKOFF_MIN: Duration = Duration::from_millis(20);
/// The longest wait between failed calls.
pub const BACKOFF_MAX: Duration = Duration::from_millis(500);
/// How long one call may take (a snapshot gets more).
const CALL_TIMEOUT: Duration = Duration::from_secs(2);
const SNAPSHOT_TIMEOUT: Duration = Duration::from_secs(120);

/// What the transport tells the raft node.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum TransportEvent {
    /// A message to this peer was lost.
    Unreachable(u64),
    /// A snapshot to this peer was delivered (`true`) or lost.
    Snapshot {
        /// The peer.
        to: u64,
        /// Whether it arrived.
        delivered: bool,
    },
}

/// Who this replica is, as every batch it sends says.
#[derive(Debug, Clone)]
struct Sender {
    id: u64,
    group: Arc<str>,
    address: Arc<str>,
}

#[derive(Debug)]
struct Peer {
    address: String,
    queue: mpsc::Sender<Message>,
    stop: CancellationToken,
}

/// How a replica proves itself to its peers: the group's admin token, and TLS when the group
/// speaks it.
#[derive(Debug, Clone)]
pub(crate) struct PeerAccess {
    /// The bearer every batch carries.
    pub(crate) bearer: Bearer,
    /// TLS to the peers, when the group speaks it.
    pub(crate) tls: Option<tonic::transport::ClientTlsConfig>,
}

/// Outbound raft traffic. See the [module documentation](self).
#[derive(Debug)]
pub(crate) struct Transport {
    me: Sender,
    bearer: Bearer,
    /// TLS to the peers, when the group speaks it.
    tls: Option<tonic::transport::ClientTlsConfig>,
    peers: BTreeMap<u64, Peer>,
    events: mpsc::UnboundedSender<TransportEvent>,
    shutdown: CancellationToken,
    tracker: TaskTracker,
    /// Messages kept for the caller instead of sent, when a simulation drives the replica
    /// ([`Transport::captured`]); `None` sends them.
    captured: Option<Vec<Message>>,
}

impl Transport {
    /// A transport for replica `id` of `group`, reachable at `address`.
    pub(crate) fn new(
        id: u64,
        group: &str,
        address: &str,
        events: mpsc::UnboundedSender<TransportEvent>,
        shutdown: CancellationToken,
        tracker: TaskTracker,
        access: PeerAccess,
    ) -> Transport {
        Transport {
            bearer: access.bearer,
            tls: access.tls,
            me: Sender {
                id,
                group: Arc::from(group),
                address: Arc::from(address),
            },
            peers: BTreeMap::new(),
            events,
            shutdown,
            tracker,
            captured: None,
        }
    }

    /// A transport that sends nothing: it keeps raft's messages until
    /// [`take_captured`](Self::take_captured) hands them to the caller (`escher-sim` delivers
    /// them over its simulated network). It starts no task and needs no runtime.
    pub(crate) fn captured(id: u64, group: &str, address: &str) -> Transport {
        let (events, _) = mpsc::unbounded_channel();
        let mut transport = Transport::new(
            id,
            group,
            address,
            events,
            CancellationToken::new(),
            TaskTracker::new(),
            PeerAccess {
                bearer: Bearer::none(),
                tls: None,
            },
        );
        transport.captured = Some(Vec::new());
        transport
    }

    /// The messages kept since the last call (none unless [`captured`](Self::captured)).
    pub(crate) fn take_captured(&mut self) -> Vec<Message> {
        self.captured
            .as_mut()
            .map(std::mem::take)
            .unwrap_or_default()
    }

    /// Makes the peers exactly `members` (less this replica): new ones get a queue and a
    /// sender, moved ones a new connection, removed ones are stopped.
    pub(crate) fn set_peers(&mut self, members: &BTreeMap<u64, String>) {
        if self.captured.is_some() {
            return;
        }
        self.peers.retain(|id, peer| {
            let keep = members.get(id) == Some(&peer.address);
            if !keep {
                peer.stop.cancel();
            }
            keep
        });
        for (id, address) in members {
            if *id == self.me.id || self.peers.contains_key(id) {
                continue;
            }
            match self.start_peer(*id, address) {
                Ok(peer) => {
                    self.peers.insert(*id, peer);
                }
                Err(why) => tracing::error!(peer = id, %address, %why, "cannot reach this replica"),
            }
        }
    }

    fn start_peer(&self, id: u64, address: &str) -> Result<Peer, String> {
        let scheme = if self.tls.is_some() { "https" } else { "http" };
        let mut endpoint =
            Endpoint::from_shared(format!("{scheme}://{address}")).map_err(|e| e.to_string())?;
        if let Some(tls) = &self.tls {
            endpoint = endpoint
                .tls_config(tls.clone())
                .map_err(|e| e.to_string())?;
        }
        let endpoint = endpoint
            .connect_timeout(Duration::from_secs(1))
            .tcp_nodelay(true)
            .http2_keep_alive_interval(Duration::from_secs(5))
            .keep_alive_timeout(Duration::from_secs(5));
        let client = RaftClient::with_interceptor(endpoint.connect_lazy(), self.bearer.clone())
            .max_decoding_message_size(MAX_RAFT_MESSAGE)
            .max_encoding_message_size(MAX_RAFT_MESSAGE);
        let (queue, rx) = mpsc::channel(QUEUE);
        let stop = self.shutdown.child_token();
        let run = PeerSender {
            me: self.me.clone(),
            to: id,
            client,
            events: self.events.clone(),
        };
        self.tracker.spawn(run.run(rx, stop.clone()));
        Ok(Peer {
            address: address.to_string(),
            queue,
            stop,
        })
    }

    /// Queues raft's messages for their receivers.
    pub(crate) fn send(&mut self, messages: Vec<Message>) {
        if let Some(kept) = &mut self.captured {
            kept.extend(messages);
            return;
        }
        for msg in messages {
            let to = msg.to;
            let Some(peer) = self.peers.get(&to) else {
                tracing::debug!(to, "a raft message for a replica with no known address");
                let _ = self.events.send(TransportEvent::Unreachable(to));
                continue;
            };
            if let Err(err) = peer.queue.try_send(msg) {
                let snapshot = match err {
                    mpsc::error::TrySendError::Full(m) | mpsc::error::TrySendError::Closed(m) => {
                        m.get_msg_type() == MessageType::MsgSnapshot
                    }
                };
                let _ = self.events.send(TransportEvent::Unreachable(to));
                if snapshot {
                    let event = TransportEvent::Snapshot {
                        to,
                        delivered: false,
                    };
                    let _ = self.events.send(event);
                }
            }
        }
    }
}

impl Drop for Transport {
    fn drop(&mut self) {
        for peer in self.peers.values() {
            peer.stop.cancel();
        }
    }
}

/// The task that sends one peer's queue.
struct PeerSender {
    me: Sender,
    to: u64,
    client: RaftClient<InterceptedService<Channel, Bearer>>,
    events: mpsc::UnboundedSender<TransportEvent>,
}

impl PeerSender {
    async fn run(mut self, mut rx: mpsc::Receiver<Message>, stop: CancellationToken) {
        let backoff = ExponentialBuilder::default()
            .with_min_delay(BACKOFF_MIN)
            .with_max_delay(BACKOFF_MAX)
            .without_max_times();
        let mut pauses = backoff.build();
        let mut held: Option<Message> = None;
        loop {
            let first = match held.take() {
                Some(m) => m,
                None => tokio::select! {
                    biased;
                    () = stop.cancelled() => return,
                    m = rx.recv() => match m {
                        Some(m) => m,
                        None => return,
                    },
                },
            };
            let snapshot = first.get_msg_type() == MessageType::MsgSnapshot;
            let mut batch = vec![first];
            while !snapshot && batch.len() < MAX_BATCH {
                match rx.try_recv() {
                    Ok(m) if m.get_msg_type() == MessageType::MsgSnapshot => {
                        held = Some(m);
                        break;
                    }
                    Ok(m) => batch.push(m),
                    Err(_) => break,
                }
            }
            let delivered = tokio::select! {
                biased;
                () = stop.cancelled() => return,
                result = self.deliver(batch, snapshot) => result,
            };
            if snapshot {
                let event = TransportEvent::Snapshot {
                    to: self.to,
                    delivered: delivered.is_ok(),
                };
                let _ = self.events.send(event);
            }
            match delivered {
                Ok(()) => pauses = backoff.build(),
                Err(why) => {
                    tracing::debug!(to = self.to, %why, "raft messages lost");
                    let _ = self.events.send(TransportEvent::Unreachable(self.to));
                    tokio::select! {
                        biased;
                        () = stop.cancelled() => return,
                        () = tokio::time::sleep(pauses.next().unwrap_or(BACKOFF_MAX)) => {}
                    }
                }
            }
        }
    }

    async fn deliver(&mut self, batch: Vec<Message>, snapshot: bool) -> Result<(), String> {
        let mut messages = Vec::with_capacity(batch.len());
        for m in &batch {
            messages.push(m.write_to_bytes().map_err(|e| e.to_string())?);
        }
        let request = wire::RaftBatch {
            group: self.me.group.to_string(),
            from: self.me.id,
            from_address: self.me.address.to_string(),
            to: self.to,
            messages,
            data_format: u32::from(super::codec::newest_readable()),
        };
        let limit = if snapshot {
            SNAPSHOT_TIMEOUT
        } else {
            CALL_TIMEOUT
        };
        match tokio::time::timeout(limit, self.client.send(request)).await {
            Ok(Ok(_)) => Ok(()),
            Ok(Err(status)) => Err(status.to_string()),
            Err(_) => Err(format!("no answer within {limit:?}")),
        }
    }
}
