//! [`Streams`]: the leader's decisions about its workers' streams, with the time passed in:
//! which stream is a node's, what goes out on it and what waits for a node that is not
//! attached, what a stream that does not read (a full queue) or that ended (closed) makes of a
//! message, what a registration supersedes, and what a leader forgets when it takes over or
//! stops; the liveness decisions about the same nodes are [`Liveness`]'s, kept here.
//!
//! It reads no clock and does no I/O: a stream is an [`Outlet`], a queue the caller owns (the
//! owner's bounded `LinkSender`, `workers.rs`; a simulated stream in `escher-sim`), which only
//! says whether it took a message. The owner (`workers.rs`, `owner/`) passes the time since an
//! origin of its own and the deterministic simulation (`escher-sim`) its simulated time, so both
//! run these rules and a bug in them is found seed by seed. It is the owner's counterpart of the
//! worker's `Protocol`.
//!
//! The rules (`workers.rs`'s module documentation):
//!
//! - a message for a node the state does not hold alive is dropped ([`Streams::send`]); one for
//!   a live node goes on its stream, or waits in the node's outbox until a stream attaches
//!   (also when the stream it was offered to has ended);
//! - a stream that attaches takes what waited first ([`Streams::attach`]), in the order queued;
//! - a stream whose queue is full does not read: it is dropped, and the node is declared lost a
//!   heartbeat timeout later unless it attaches again ([`Liveness::overflowed`]); the message
//!   that found it full is dropped (the worker's next registration reconciles what it runs);
//! - a node's registration (`Effect::Rejoined`) supersedes what was queued for its tasks (the
//!   reconcile that follows re-derives it from the state) and the stream the node had: the
//!   worker opened it before it registered, and it reads it no more, so what the reconcile
//!   sends waits for the stream the worker opens next ([`Streams::rejoined`]);
//! - a stream is taken only for a node whose registration this leadership answered
//!   ([`Streams::registered_here`]); a replica that takes over or stops leading forgets every
//!   stream and everything queued ([`Streams::lead`], [`Streams::drop_all`]).

use std::collections::BTreeMap;
use std::time::Duration;

use escher_proto::types::{HeadMessage, NodeId};

use super::liveness::{Heard, Liveness};
use crate::state::ClusterState;

/// What a stream's queue made of a message ([`Outlet::offer`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Offer<M> {
    /// Queued on the stream.
    Taken,
    /// The queue is full (its worker does not read): the message is dropped.
    Full,
    /// The stream has ended: the message is given back.
    Closed(M),
}

/// The sending end of a worker's stream, as [`Streams`] sees it.
pub trait Outlet<M> {
    /// Queues `msg` on the stream, if it can.
    fn offer(&self, msg: M) -> Offer<M>;
    /// How many messages wait on the stream.
    fn depth(&self) -> usize;
}

/// What a registration supersedes in a node's outbox ([`Streams::rejoined`]).
pub trait Superseded {
    /// Whether a registration re-derives this message from the state (an assignment, a
    /// cancellation): queued before it, it is dropped.
    fn superseded(&self) -> bool;
}

impl Superseded for HeadMessage {
    fn superseded(&self) -> bool {
        matches!(
            self,
            HeadMessage::Assign(_) | HeadMessage::CancelTask { .. }
        )
    }
}

/// A node's current stream: its connection number and its sending end.
#[derive(Debug)]
struct Link<L> {
    conn: u64,
    outlet: L,
}

/// The leader's view of its workers' streams. See the [module documentation](self).
#[derive(Debug)]
pub struct Streams<L, M> {
    links: BTreeMap<NodeId, Link<L>>,
    /// Messages for live nodes that are not attached (yet, or again).
    outbox: BTreeMap<NodeId, Vec<M>>,
    /// When each node was last heard, which streams overflowed, whose registration this
    /// leadership answered.
    liveness: Liveness,
    /// How many streams were dropped because they were full.
    overflows: u64,
}

impl<L, M> Default for Streams<L, M> {
    fn default() -> Self {
        Streams {
            links: BTreeMap::new(),
            outbox: BTreeMap::new(),
            liveness: Liveness::default(),
            overflows: 0,
        }
    }
}

impl<L: Outlet<M>, M: Superseded> Streams<L, M> {
    /// `node`'s stream `conn` opened at `now`: what waited for the node goes out on it first,
    /// in order. A stream that is full at once is dropped as [`Streams::send`] drops one; one
    /// that has ended already is not linked, and what waited waits on.
    pub fn attach(&mut self, node: NodeId, conn: u64, outlet: L, now: Duration) {
        let mut waiting = self.outbox.remove(&node).unwrap_or_default().into_iter();
        self.links.remove(&node);
        while let Some(msg) = waiting.next() {
            match outlet.offer(msg) {
                Offer::Taken => {}
                Offer::Full => {
                    self.overflow(node, now);
                    return;
                }
                Offer::Closed(msg) => {
                    let mut back = vec![msg];
                    back.extend(waiting);
                    self.outbox.insert(node, back);
                    return;
                }
            }
        }
        self.links.insert(node, Link { conn, outlet });
        self.liveness.attached(node, now);
    }

    /// `node`'s stream `conn` closed; whether it was the node's current one.
    pub fn detach(&mut self, node: NodeId, conn: u64) -> bool {
        if self.links.get(&node).is_some_and(|l| l.conn == conn) {
            self.links.remove(&node);
            return true;
        }
        false
    }

    /// Sends `msg` to a live node's worker now, or when it attaches; drops it for a node the
    /// state does not hold alive.
    pub fn send(&mut self, state: &ClusterState, node: NodeId, msg: M, now: Duration) {
        if !state.node_alive(node) {
            return;
        }
        let msg = match self.links.get(&node) {
            Some(link) => match link.outlet.offer(msg) {
                Offer::Taken => return,
                Offer::Closed(msg) => msg,
                Offer::Full => {
                    self.overflow(node, now);
                    return;
                }
            },
            None => msg,
        };
        self.outbox.entry(node).or_default().push(msg);
    }

    /// Sends on the node's open stream only; false if there is none (or it is full: then it is
    /// dropped, as [`Streams::send`] drops it).
    pub fn send_now(&mut self, node: NodeId, msg: M, now: Duration) -> bool {
        let Some(link) = self.links.get(&node) else {
            return false;
        };
        match link.outlet.offer(msg) {
            Offer::Taken => true,
            Offer::Full => {
                self.overflow(node, now);
                false
            }
            Offer::Closed(_) => false,
        }
    }

    /// A stream is full: its worker does not read. The stream is dropped (its lease is renewed
    /// no more) and the node is declared lost a heartbeat timeout later unless it attaches
    /// again.
    fn overflow(&mut self, node: NodeId, now: Duration) {
        tracing::warn!(
            %node,
            "the worker does not read its stream; disconnecting it, its node will be declared lost"
        );
        self.overflows += 1;
        self.links.remove(&node);
        self.liveness.overflowed(node, now);
    }

    /// `node` registered again (`Effect::Rejoined`): its queued assignments and cancellations
    /// are superseded by the ones its registration re-derives from the state, and its stream
    /// (opened before the registration; the worker has left it) is dropped, so that those go
    /// on the stream the worker opens next.
    pub fn rejoined(&mut self, node: NodeId) {
        self.links.remove(&node);
        if let Some(queued) = self.outbox.get_mut(&node) {
            queued.retain(|m| !m.superseded());
        }
    }
}

impl<L: Outlet<M>, M> Streams<L, M> {
    /// How many messages wait for each node that has any or has a stream: on its stream, and
    /// queued until it attaches, in node order.
    pub fn depths(&self) -> Vec<(NodeId, usize)> {
        let mut depth: BTreeMap<NodeId, usize> = self
            .links
            .iter()
            .map(|(node, link)| (*node, link.outlet.depth()))
            .collect();
        for (node, queued) in &self.outbox {
            *depth.entry(*node).or_default() += queued.len();
        }
        depth.into_iter().collect()
    }
}

impl<L, M> Streams<L, M> {
    /// This leadership answered `node`'s registration at `now`: what it queued for the node
    /// goes out on the stream the worker opens next, here.
    pub fn registered(&mut self, node: NodeId, now: Duration) {
        self.liveness.registered(node, now);
    }

    /// Whether this leadership answered `node`'s registration (and has not forgotten the node
    /// since): else its stream is refused, and the worker registers again.
    pub fn registered_here(&self, node: NodeId) -> bool {
        self.liveness.registered_here(node)
    }

    /// A message of `node`'s worker arrived at `now` at a leader (`cannot_lead`: whose disk is
    /// full in a group): whether it counts, and whether a heartbeat renews the lease
    /// ([`Liveness::heard`]).
    pub fn heard(
        &mut self,
        state: &ClusterState,
        node: NodeId,
        now: Duration,
        cannot_lead: bool,
    ) -> Heard {
        self.liveness.heard(state, node, now, cannot_lead)
    }

    /// Forgets a node that left or was declared lost: its stream, its outbox, its clock.
    pub fn forget(&mut self, node: NodeId) {
        self.links.remove(&node);
        self.outbox.remove(&node);
        self.liveness.forget(node);
    }

    /// The leader's check at `now`: the live nodes to declare lost ([`Liveness::tick`]: silent
    /// for longer than `timeout`, or whose stream overflowed longer ago than that; none while
    /// the replica cannot lead now); each is forgotten as it is returned.
    pub fn tick(
        &mut self,
        state: &ClusterState,
        timeout: Duration,
        now: Duration,
        cannot_lead: bool,
    ) -> Vec<NodeId> {
        let silent = self.liveness.tick(state, timeout, now, cannot_lead);
        for node in &silent {
            self.forget(*node);
        }
        silent
    }

    /// This replica became the leader at `now`: it forgets every stream, and every live node
    /// gets a full heartbeat timeout to find it.
    pub fn lead(&mut self, state: &ClusterState, now: Duration) -> Vec<(NodeId, u64)> {
        let dropped = self.drop_all();
        self.liveness.lead(state, now);
        dropped
    }

    /// This replica stopped leading (or is stopping, or lets its workers go): every stream
    /// ends and everything queued is forgotten; the streams it held (node, connection).
    pub fn drop_all(&mut self) -> Vec<(NodeId, u64)> {
        let dropped = self.conns().collect();
        self.links.clear();
        self.outbox.clear();
        self.liveness.clear();
        dropped
    }

    /// The current stream of each attached node (node, connection), in node order.
    pub fn conns(&self) -> impl Iterator<Item = (NodeId, u64)> + '_ {
        self.links.iter().map(|(node, link)| (*node, link.conn))
    }

    /// `node`'s current stream, if it has one.
    pub fn conn(&self, node: NodeId) -> Option<u64> {
        self.links.get(&node).map(|link| link.conn)
    }

    /// How many nodes are attached.
    pub fn len(&self) -> usize {
        self.links.len()
    }

    /// Whether no node is attached.
    pub fn is_empty(&self) -> bool {
        self.links.is_empty()
    }

    /// How many streams were dropped because they were full.
    pub fn overflows(&self) -> u64 {
        self.overflows
    }
}

#[cfg(test)]
mod tests {
    use std::cell::RefCell;

    use super::*;
    use crate::runtime::liveness::tests::state_with;

    const TIMEOUT: Duration = Duration::from_millis(2_000);

    fn ms(n: u64) -> Duration {
        Duration::from_millis(n)
    }

    /// A message: a task's (superseded by a registration) or not.
    #[derive(Debug, Clone, PartialEq, Eq)]
    enum Msg {
        Task(u32),
        Other(u32),
    }

    impl Superseded for Msg {
        fn superseded(&self) -> bool {
            matches!(self, Msg::Task(_))
        }
    }

    /// A stream's queue of `room` messages, or one that has ended.
    #[derive(Debug, Default)]
    struct Queue {
        taken: RefCell<Vec<Msg>>,
        room: usize,
        closed: bool,
    }

    impl Queue {
        fn with_room(room: usize) -> Queue {
            Queue {
                room,
                ..Queue::default()
            }
        }
    }

    impl Outlet<Msg> for &Queue {
        fn offer(&self, msg: Msg) -> Offer<Msg> {
            if self.closed {
                return Offer::Closed(msg);
            }
            let mut taken = self.taken.borrow_mut();
            if taken.len() >= self.room {
                return Offer::Full;
            }
            taken.push(msg);
            Offer::Taken
        }

        fn depth(&self) -> usize {
            self.taken.borrow().len()
        }
    }

    #[test]
    fn what_waits_for_a_node_goes_out_first_in_order_when_its_stream_attaches() {
        let (state, nodes) = state_with(1);
        let node = nodes[0];
        let mut streams = Streams::default();
        streams.lead(&state, ms(0));
        streams.send(&state, node, Msg::Task(1), ms(1));
        streams.send(&state, node, Msg::Other(2), ms(2));
        assert_eq!(streams.depths(), vec![(node, 2)]);
        let queue = Queue::with_room(10);
        streams.registered(node, ms(3));
        streams.attach(node, 7, &queue, ms(4));
        streams.send(&state, node, Msg::Task(3), ms(5));
        assert_eq!(
            *queue.taken.borrow(),
            vec![Msg::Task(1), Msg::Other(2), Msg::Task(3)]
        );
        assert_eq!(streams.conn(node), Some(7));
        // Only the current stream's end detaches the node.
        assert!(!streams.detach(node, 6));
        assert!(streams.detach(node, 7));
        streams.send(&state, node, Msg::Task(4), ms(6));
        assert_eq!(streams.depths(), vec![(node, 1)]);
    }

    #[test]
    fn a_message_for_a_node_not_alive_is_dropped() {
        let (state, _) = state_with(0);
        let mut streams: Streams<&Queue, Msg> = Streams::default();
        streams.send(&state, NodeId(9), Msg::Task(1), ms(0));
        assert!(streams.depths().is_empty());
    }

    #[test]
    fn a_full_stream_is_dropped_and_its_node_declared_lost_a_timeout_later() {
        let (state, nodes) = state_with(1);
        let node = nodes[0];
        let mut streams = Streams::default();
        streams.lead(&state, ms(0));
        let queue = Queue::with_room(1);
        streams.attach(node, 1, &queue, ms(0));
        streams.send(&state, node, Msg::Task(1), ms(10));
        // Full: dropped, and the stream with it.
        streams.send(&state, node, Msg::Task(2), ms(20));
        assert_eq!(streams.overflows(), 1);
        assert_eq!(streams.conn(node), None);
        assert!(!streams.send_now(node, Msg::Other(3), ms(30)));
        // Still heard (its heartbeats arrive), it is declared lost all the same.
        streams.heard(&state, node, ms(2_000), false);
        assert!(streams.tick(&state, TIMEOUT, ms(2_020), false).is_empty());
        assert_eq!(streams.tick(&state, TIMEOUT, ms(2_021), false), vec![node]);
        assert!(streams.depths().is_empty());
    }

    #[test]
    fn a_stream_that_ended_gives_its_message_back_to_the_outbox() {
        let (state, nodes) = state_with(1);
        let node = nodes[0];
        let mut streams = Streams::default();
        streams.lead(&state, ms(0));
        let ended = Queue {
            closed: true,
            ..Queue::default()
        };
        streams.send(&state, node, Msg::Task(1), ms(1));
        // Attached on a stream that has ended already: not linked, nothing lost.
        streams.attach(node, 1, &ended, ms(2));
        assert_eq!(streams.conn(node), None);
        assert_eq!(streams.depths(), vec![(node, 1)]);
        let open = Queue::with_room(10);
        streams.attach(node, 2, &open, ms(3));
        let ended_later = Queue {
            closed: true,
            ..Queue::default()
        };
        streams.attach(node, 3, &ended_later, ms(4));
        streams.send(&state, node, Msg::Task(2), ms(5));
        assert_eq!(*open.taken.borrow(), vec![Msg::Task(1)]);
        assert_eq!(streams.depths(), vec![(node, 1)]);
    }

    #[test]
    fn a_registration_supersedes_the_queued_task_messages_and_the_stream_before_it() {
        let (state, nodes) = state_with(1);
        let node = nodes[0];
        let mut streams = Streams::default();
        streams.lead(&state, ms(0));
        streams.send(&state, node, Msg::Task(1), ms(1));
        streams.send(&state, node, Msg::Other(2), ms(1));
        let old = Queue::with_room(10);
        streams.attach(node, 1, &old, ms(2));
        streams.detach(node, 1);
        streams.send(&state, node, Msg::Task(3), ms(3));
        streams.send(&state, node, Msg::Other(4), ms(3));
        let stale = Queue::with_room(10);
        streams.attach(node, 2, &stale, ms(4));
        // The worker registered again: the stream it had is not where the reconcile's
        // messages go, and what was queued for its tasks is superseded.
        streams.rejoined(node);
        assert_eq!(streams.conn(node), None);
        streams.send(&state, node, Msg::Task(5), ms(5));
        assert_eq!(*stale.taken.borrow(), vec![Msg::Task(3), Msg::Other(4)]);
        let new = Queue::with_room(10);
        streams.registered(node, ms(6));
        streams.attach(node, 3, &new, ms(6));
        assert_eq!(*new.taken.borrow(), vec![Msg::Task(5)]);
    }

    #[test]
    fn a_new_leadership_forgets_every_stream_and_queue_and_registration() {
        let (state, nodes) = state_with(2);
        let mut streams = Streams::default();
        streams.lead(&state, ms(0));
        let queue = Queue::with_room(10);
        streams.registered(nodes[0], ms(1));
        streams.attach(nodes[0], 4, &queue, ms(1));
        streams.send(&state, nodes[1], Msg::Task(1), ms(1));
        assert!(streams.registered_here(nodes[0]));
        assert_eq!(streams.lead(&state, ms(5)), vec![(nodes[0], 4)]);
        assert!(streams.is_empty());
        assert!(streams.depths().is_empty());
        assert!(!streams.registered_here(nodes[0]));
        // Every live node's clock starts anew.
        assert!(streams.tick(&state, TIMEOUT, ms(2_005), false).is_empty());
        assert_eq!(streams.tick(&state, TIMEOUT, ms(2_006), false), nodes);
    }
}
