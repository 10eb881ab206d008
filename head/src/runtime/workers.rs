//! [`Workers`]: the leader's soft state about its workers: the open stream of each node, what
//! waits for a node that is not attached, when each was last heard from, and the task reports
//! committed in this cycle that are still to be acknowledged.
//!
//! # The worker-report protocol (head side)
//!
//! A worker keeps every `TaskFinished` it sends until the head acknowledges it. The head
//! proposes each report as a `TaskFinished` command and, once that entry is applied, counts it
//! as committed; `ReportsAcked` goes out on the worker's stream with the head's next tick
//! (every 100 ms), or at once when [`ACK_BATCH`] reports of a node wait: one small message per
//! tick instead of one per task, and the worker's memory of reports stays bounded. A worker that re-registers (a
//! broken stream, a new leader) lists its unacknowledged reports and what it still runs; the
//! registration's `RejoinNode` command applies the reports and reconciles the rest
//! (`state/nodes.rs`): an assignment the worker never received is sent again with the same
//! attempt, and the committed registration reply acknowledges the reports it carried. So an
//! acknowledged report is committed, a committed report is never applied twice (a stale
//! attempt is ignored), and a task that was running stays running through a failover.
//!
//! # Leases (DESIGN §13)
//!
//! Each heartbeat the leader hears is answered with `LeaseRenewed`: the worker's lease runs for
//! half the heartbeat timeout from when it sent that heartbeat, and a worker whose lease ran
//! out stops its tasks. A node is declared lost, and its tasks retried, only after a full
//! heartbeat timeout without a heartbeat, on this replica's own clock: at least half a timeout
//! after any lease it was granted expired. A new leader starts every node's clock when it
//! takes over, so it honours the leases its predecessor granted (which stopped granting when
//! it lost its quorum); a failover shorter than the lease stops nothing. These decisions are
//! [`Liveness`]'s (`liveness.rs`), with the time passed in: the simulation (`escher-sim`) runs
//! the same code on its simulated clock.
//!
//! Back-pressure: each stream's queue holds at most [`OUTBOX`] messages and [`OUTBOX_BYTES`]
//! bytes (an assignment counts its spec). A worker that does not read its stream (stopped, or
//! hostile) fills it; the head then drops the stream, renews its lease no more, and declares
//! the node lost a heartbeat timeout later unless it attaches again: its messages are never
//! buffered without bound, and its tasks are retried only once its lease surely expired.
//!
//! Everything here is soft: a new leader starts with no links, gives every live node a fresh
//! heartbeat deadline, and learns the rest as workers re-register. A replica that stops
//! leading drops every link, which ends the workers' streams and sends them looking for the
//! new leader.
//!
//! The decisions about the streams (which is a node's, what goes out on it or waits for it,
//! what a full or ended stream makes of a message, what a registration supersedes, what a
//! leader forgets) are [`Streams`]'s (`streams.rs`), with the time passed in and each stream's
//! queue behind its [`Outlet`]: the simulation runs the same code over its simulated streams.
//! What stays here is the queue itself ([`LinkSender`], bounded in messages and bytes), the
//! owner's clock, and the batching of acknowledgements.
//!
//! # A registration supersedes the stream before it
//!
//! A worker that registers again has left the stream it had (it stops reading it before it
//! registers); the head may not have seen that stream end yet (its reset races the
//! registration, and a frozen or cut worker's connection can look open for long). The
//! reconcile's assignments would go on that stream and be lost, and the tasks would stay
//! running on a node that never heard of them (simulation seed 300, docs/RELIABILITY.md). So
//! the registration's `Effect::Rejoined` drops the node's stream with its queued task
//! messages ([`Streams::rejoined`]), and what the reconcile sends waits for the stream the
//! worker opens next.
//!
//! # One leadership from registration to stream
//!
//! A registration's reconcile queues what the worker must run or stop for its stream, in
//! this leadership's outbox. A replica that loses its leadership forgets that outbox; if it
//! wins again before the worker's stream arrives, the stream would open on a leadership that
//! never queued anything for it, and the tasks the reconcile placed there would stay running
//! on a node that never heard of them (simulation seed 1749, docs/RELIABILITY.md). So a stream
//! is taken only for a node whose registration this leadership answered
//! ([`Workers::registered`]); any other is refused with FAILED_PRECONDITION, "register
//! again", and the worker's next registration reconciles anew.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use escher_proto::types::{HeadMessage, NodeId, RunningTask};
use rustc_hash::FxHashMap;
use tokio::sync::mpsc;

use super::liveness::Heard;
use super::streams::{Offer, Outlet, Streams};
use crate::state::ClusterState;

/// Committed reports of one node that are acknowledged at once rather than with the tick.
pub(crate) const ACK_BATCH: usize = 1024;

/// The most messages queued on one worker's stream.
pub(crate) const OUTBOX: usize = 65_536;

/// The most bytes of messages queued on one worker's stream (see
/// [`HeadMessage::queued_bytes`]).
pub(crate) const OUTBOX_BYTES: u64 = 64 * 1024 * 1024;

/// The sending end of a worker's stream: a queue bounded in messages and in bytes.
#[derive(Debug, Clone)]
pub(crate) struct LinkSender {
    tx: mpsc::Sender<HeadMessage>,
    /// Bytes queued and not yet taken by the stream.
    queued: Arc<AtomicU64>,
    /// The most bytes it may hold.
    limit: u64,
}

/// The receiving end of a worker's stream.
#[derive(Debug)]
pub(crate) struct LinkReceiver {
    rx: mpsc::Receiver<HeadMessage>,
    queued: Arc<AtomicU64>,
}

/// A worker's stream queue: at most [`OUTBOX`] messages and `limit` bytes ([`OUTBOX_BYTES`]).
pub(crate) fn link_channel(limit: u64) -> (LinkSender, LinkReceiver) {
    let (tx, rx) = mpsc::channel(OUTBOX);
    let queued = Arc::new(AtomicU64::new(0));
    (
        LinkSender {
            tx,
            queued: Arc::clone(&queued),
            limit,
        },
        LinkReceiver { rx, queued },
    )
}

impl LinkSender {
    /// Queues `msg`, or gives it back: `Full` when the queue holds its most messages or bytes.
    /// (The error is as large as the message: it is the message, given back unboxed as
    /// tokio's own `try_send` gives it.)
    #[allow(clippy::result_large_err)]
    fn try_send(&self, msg: HeadMessage) -> Result<(), mpsc::error::TrySendError<HeadMessage>> {
        let size = msg.queued_bytes();
        if self.queued.load(Ordering::Relaxed).saturating_add(size) > self.limit {
            return Err(mpsc::error::TrySendError::Full(msg));
        }
        self.tx.try_send(msg)?;
        self.queued.fetch_add(size, Ordering::Relaxed);
        Ok(())
    }

    fn depth(&self) -> usize {
        self.tx.max_capacity() - self.tx.capacity()
    }
}

impl LinkReceiver {
    /// The queued messages as a stream; each leaves the byte count as it is taken.
    pub(crate) fn into_stream(self) -> impl tokio_stream::Stream<Item = HeadMessage> {
        let LinkReceiver { rx, queued } = self;
        tokio_stream::StreamExt::map(tokio_stream::wrappers::ReceiverStream::new(rx), move |m| {
            queued.fetch_sub(m.queued_bytes(), Ordering::Relaxed);
            m
        })
    }
}

impl Outlet<HeadMessage> for LinkSender {
    fn offer(&self, msg: HeadMessage) -> Offer<HeadMessage> {
        match self.try_send(msg) {
            Ok(()) => Offer::Taken,
            Err(mpsc::error::TrySendError::Full(_)) => Offer::Full,
            Err(mpsc::error::TrySendError::Closed(msg)) => Offer::Closed(msg),
        }
    }

    fn depth(&self) -> usize {
        LinkSender::depth(self)
    }
}

/// The leader's view of its workers. See the [module documentation](self).
#[derive(Debug)]
pub(crate) struct Workers {
    /// Each node's stream, what waits for a node that is not attached, when each was last
    /// heard, which streams overflowed, whose registration this leadership answered (the only
    /// nodes whose stream it takes, see the [module documentation](self)): the decisions about
    /// them are [`Streams`]'s and its [`Liveness`]'s, shared with the simulation.
    ///
    /// [`Liveness`]: super::liveness::Liveness
    streams: Streams<LinkSender, HeadMessage>,
    /// Reports committed in this cycle, by node, to acknowledge.
    acks: FxHashMap<NodeId, Vec<RunningTask>>,
    /// What the times given to `streams` are measured from.
    origin: Instant,
}

impl Default for Workers {
    fn default() -> Workers {
        Workers {
            streams: Streams::default(),
            acks: FxHashMap::default(),
            origin: Instant::now(),
        }
    }
}

impl Workers {
    /// The time [`Streams`] is given: since this owner started.
    fn now(&self) -> Duration {
        self.origin.elapsed()
    }

    /// A worker's stream opened: what waited for it goes out first.
    pub(crate) fn attach(&mut self, node: NodeId, conn: u64, tx: LinkSender) {
        let now = self.now();
        self.streams.attach(node, conn, tx, now);
    }

    /// A worker's stream closed; whether it was the node's current one.
    pub(crate) fn detach(&mut self, node: NodeId, conn: u64) -> bool {
        self.streams.detach(node, conn)
    }

    /// Sends to a live node's worker now, or when it attaches.
    pub(crate) fn send(&mut self, state: &ClusterState, node: NodeId, msg: HeadMessage) {
        let now = self.now();
        self.streams.send(state, node, msg, now);
    }

    /// How many messages wait for each worker that has any or has a stream: on its stream,
    /// and queued until it attaches.
    pub(crate) fn depths(&self) -> Vec<(NodeId, usize)> {
        self.streams.depths()
    }

    /// Sends on the node's open stream only; false if there is none (or it is full: the
    /// worker does not read, its stream is dropped and its node declared lost a heartbeat
    /// timeout later unless it attaches again).
    pub(crate) fn send_now(&mut self, node: NodeId, msg: HeadMessage) -> bool {
        let now = self.now();
        self.streams.send_now(node, msg, now)
    }

    /// A worker re-registered: queued assignments and cancellations are superseded by the
    /// ones its registration re-derives from the state, and so is the stream it had
    /// ([`Streams::rejoined`]).
    pub(crate) fn rejoined(&mut self, node: NodeId) {
        self.streams.rejoined(node);
    }

    /// This leadership answered `node`'s registration: what it queued for the node goes out
    /// on the stream the worker opens next, here.
    pub(crate) fn registered(&mut self, node: NodeId) {
        let now = self.now();
        self.streams.registered(node, now);
    }

    /// Whether this leadership answered `node`'s registration (and has not forgotten the node
    /// since): else its stream is refused, and the worker registers again.
    pub(crate) fn registered_here(&self, node: NodeId) -> bool {
        self.streams.registered_here(node)
    }

    /// A message of `node`'s worker arrived at a leader (`cannot_lead`: whose disk is full in
    /// a group): whether it counts, and whether a heartbeat renews the lease
    /// ([`Liveness::heard`](super::liveness::Liveness::heard)).
    pub(crate) fn heard(&mut self, state: &ClusterState, node: NodeId, cannot_lead: bool) -> Heard {
        let now = self.now();
        self.streams.heard(state, node, now, cannot_lead)
    }

    /// Forgets a node that left or was declared lost.
    pub(crate) fn forget(&mut self, node: NodeId) {
        self.streams.forget(node);
        self.acks.remove(&node);
    }

    /// The leader's check: the live nodes to declare lost ([`Streams::tick`]: silent for
    /// longer than `timeout`, or whose stream overflowed longer ago than that; none while the
    /// replica cannot lead now); each is forgotten as it is returned.
    pub(crate) fn tick(
        &mut self,
        state: &ClusterState,
        timeout: Duration,
        cannot_lead: bool,
    ) -> Vec<NodeId> {
        let now = self.now();
        let silent = self.streams.tick(state, timeout, now, cannot_lead);
        for node in &silent {
            self.acks.remove(node);
        }
        silent
    }

    /// This replica became the leader: every live node gets a full heartbeat timeout to find
    /// it.
    pub(crate) fn lead(&mut self, state: &ClusterState) {
        self.acks.clear();
        let now = self.now();
        self.streams.lead(state, now);
    }

    /// This replica stopped leading (or is stopping): every stream ends, the workers go and
    /// find the leader.
    pub(crate) fn drop_all(&mut self) {
        self.streams.drop_all();
        self.acks.clear();
    }

    /// A report of `node` was committed: acknowledge it with the next tick (or now, when
    /// [`ACK_BATCH`] of the node's reports wait).
    pub(crate) fn ack(&mut self, node: NodeId, report: RunningTask) {
        let waiting = self.acks.entry(node).or_default();
        waiting.push(report);
        if waiting.len() >= ACK_BATCH {
            let reports = std::mem::take(waiting);
            self.send_now(node, HeadMessage::ReportsAcked(reports));
        }
    }

    /// Sends the acknowledgements that wait. A worker not attached gets none: it re-sends the
    /// reports when it registers again, and the registration acknowledges them.
    pub(crate) fn flush_acks(&mut self) {
        let waiting: Vec<_> = self.acks.drain().collect();
        for (node, reports) in waiting {
            self.send_now(node, HeadMessage::ReportsAcked(reports));
        }
    }

    /// How many workers are attached.
    pub(crate) fn len(&self) -> usize {
        self.streams.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use escher_proto::types::{Assignment, TaskId, TaskKind, TaskSpec};
    use tokio_stream::StreamExt;

    fn assign(argv_bytes: usize) -> HeadMessage {
        let spec = TaskSpec {
            name: "t".into(),
            kind: TaskKind::Command {
                argv: vec!["x".repeat(argv_bytes)],
                env: Vec::new(),
                cwd: None,
            },
            resources: Default::default(),
            labels: Default::default(),
            max_retries: 0,
            timeout: None,
            pending_deadline: None,
            on_start: Vec::new(),
            on_success: Vec::new(),
        };
        HeadMessage::Assign(Assignment {
            task_id: TaskId(1),
            attempt: 1,
            allocation: spec.resources.clone(),
            spec,
            task_token: String::new(),
            objects: Vec::new(),
        })
    }

    #[tokio::test]
    async fn a_workers_queue_is_bounded_in_bytes_and_frees_what_it_sends() {
        let (tx, rx) = link_channel(10_000);
        tx.try_send(assign(4000)).unwrap();
        tx.try_send(assign(4000)).unwrap();
        // A third would pass 10,000 bytes: full, though far from the message bound.
        assert!(matches!(
            tx.try_send(assign(4000)),
            Err(mpsc::error::TrySendError::Full(_))
        ));
        let mut stream = Box::pin(rx.into_stream());
        stream.next().await.unwrap();
        // What the stream took no longer counts.
        tx.try_send(assign(4000)).unwrap();
    }
}
