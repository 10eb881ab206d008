//! The workers in the world: their events, the faults they suffer, and the leader's side of
//! their streams ([`Owner`]). The leader's decisions about its workers' streams and liveness
//! (which stream is a node's, what goes out on it and what waits for a node not attached, what
//! a registration supersedes, messages for a node not alive dropped, heartbeat clocks, which
//! heartbeat renews a lease, when a node is declared lost, the full timeout a new leader
//! grants, ignoring nodes declared lost, nothing renewed or declared while the disk is full)
//! are the head's own code, `escher_head::runtime::streams::Streams` and its `Liveness`, run
//! on the simulated clock; only the streams themselves ([`SimLink`]: what the owner's bounded
//! queue and gRPC carry) are the simulated network's. The worker's rules are the worker's own
//! code too (`escher_worker::protocol::Protocol`, see `worker.rs`).
//!
//! A stream is modelled as TCP gives it: its messages arrive in the order sent or not at all,
//! and a message lost breaks the stream (the leader forgets it; the worker learns it a moment
//! later and registers again). Heartbeats and their answers are on the stream too; a lost one
//! breaks it the same way. Faults: a worker's process crashes (its tasks die with it) and
//! comes back 0.5–5 s later as a new boot; a worker is frozen (SIGSTOP) for 0.3–6 s while its
//! tasks and its fence supervisor run on; a worker is cut from every replica for 0.3–8 s.
//!
//! With the stream faults ([`Options::stream_faults`], on by default) the streams fail as real
//! ones do, and the owner's own rules for a full and a closed queue (`Streams`' `Offer::Full` and
//! `Offer::Closed`) decide what happens: the network closes a worker's stream (0–3 times per
//! worker; so does a lost message), the worker hears of it within the network's longest delay
//! and the leader within twice that, and what the leader sends meanwhile finds the stream closed
//! and waits in the node's outbox; a worker stops reading its stream for 0.2–3 s (0–2 times per
//! worker) while it heartbeats on, and the stream's queue (a room of 3–8 messages per seed,
//! lease renewals included, as the head sends them on the stream's queue) may fill: the leader
//! drops a full stream with the message that found it full, the stream ends for the worker once
//! it has read what the queue held, and the node is declared lost a heartbeat timeout later
//! unless its worker attaches again. The queue is bounded in bytes too
//! ([`Options::stream_bytes`]), each message counted as the head's `LinkSender` counts it
//! (`HeadMessage::queued_bytes`), and one side of a stream may close while the other goes on
//! ([`Options::half_closes`], [`World::half_close`]).
//!
//! [`Options::stream_faults`]: crate::world::Options::stream_faults
//! [`Options::stream_bytes`]: crate::world::Options::stream_bytes
//! [`Options::half_closes`]: crate::world::Options::half_closes

use std::cell::RefCell;
use std::collections::{BTreeMap, BTreeSet};
use std::rc::Rc;
use std::time::Duration;

use escher_core::state::{Command, Effect, Joining, Returning, SecretHash};
use escher_head::replication::sim::SimReplica;
use escher_head::runtime::liveness::{self, Heard};
use escher_head::runtime::streams::{Offer, Outlet, Streams, Superseded};
use escher_proto::types::{
    ClusterEvent, HeadMessage, Labels, NodeChange, NodeId, TaskFinished, TaskResult, WatchEvent,
};
use rand::Rng;

use super::{Event, World};
use crate::client::{Client, Intent};
use crate::history::Execution;
use crate::worker::{
    CPUS, HEARTBEAT_MS, HEARTBEAT_TIMEOUT_MS, SILENCE_MS, SUPERVISE_MS, ToWorker, Worker, beat_ms,
    lease_ms,
};
use escher_worker::protocol::Admit;

/// What a worker sends on its stream.
#[derive(Debug, Clone)]
pub(super) enum FromWorker {
    /// Opens the stream of this epoch (after a registration), sent at `sent`.
    Attach {
        /// When.
        sent: u64,
    },
    /// A heartbeat, numbered `seq`.
    Heartbeat {
        /// Its number.
        seq: u64,
    },
}

/// The leader's soft state about the workers, as the head's owner keeps it: the head's own
/// [`Streams`] (each node's open stream, what waits for a node whose stream is not open) and
/// its `Liveness` (when each node was last heard, the nodes whose registration this leadership
/// answered, the only ones whose stream it takes). A new leader starts every live node's clock
/// when it takes over; a replica that stops leading forgets it all.
pub(super) type Owner = Streams<SimLink, ToWorker>;

/// The workers' streams as the owners' queues and the network hold them, shared by the world and
/// every [`SimLink`].
pub(super) type Wire = Rc<RefCell<Pipes>>;

/// What the owners' streams took and the world is still to send, and the state of each stream
/// (worker, epoch) that the stream faults ([`Options::stream_faults`]) give it.
///
/// [`Options::stream_faults`]: crate::world::Options::stream_faults
#[derive(Debug, Default)]
pub(super) struct Pipes {
    /// What the owners' streams took: (worker, stream epoch, message), in the order taken.
    taken: Vec<(usize, u64, ToWorker)>,
    /// The streams the network closed: their queue gives every message back (`Offer::Closed`)
    /// until the leader sees the stream end.
    closed: BTreeSet<(usize, u64)>,
    /// How many messages each stream's queue holds: taken, and not yet read by its worker.
    queued: BTreeMap<(usize, u64), usize>,
    /// How many bytes of messages each stream's queue holds (`HeadMessage::queued_bytes`, as
    /// the head's `LinkSender` counts them against `OUTBOX_BYTES`).
    queued_bytes: BTreeMap<(usize, u64), u64>,
    /// The most messages a stream's queue holds (per seed); `None`: no bound.
    room: Option<usize>,
    /// The most bytes a stream's queue holds (per seed, [`Options::stream_bytes`]); `None`:
    /// no bound.
    ///
    /// [`Options::stream_bytes`]: crate::world::Options::stream_bytes
    room_bytes: Option<u64>,
    /// Streams found full by their bytes while they held fewer messages than their room, since
    /// the world last counted them.
    full_by_bytes: u64,
    /// The streams whose head's side closed (the head reads nothing more of them and has
    /// forgotten them; their worker still reads what their queue held).
    head_closed: BTreeSet<(usize, u64)>,
    /// The streams whose worker's side closed while their head still holds them: their queue
    /// takes what the head offers, and nobody reads it, until the head sees the reset.
    worker_closed: BTreeSet<(usize, u64)>,
    /// Messages taken by a stream whose worker's side had closed, since the world last counted
    /// them.
    taken_unread: u64,
    /// The streams found full, which the owner dropped: each ends once its worker has read
    /// what it holds.
    full: Vec<(usize, u64)>,
    /// Until when each stalled stream is not read by its worker.
    stalled: BTreeMap<(usize, u64), u64>,
    /// Messages offered to a closed stream since the world last counted them.
    offered_closed: u64,
}

/// A removal a leader proposed of a node it declared lost, followed until the replica applies
/// it (`World::removal_applied`).
#[derive(Debug)]
pub(super) struct Removal {
    /// The node.
    pub(super) node: NodeId,
    /// The term of the proposal.
    pub(super) term: u64,
    /// The node's registration the leader judged (its number, if it has one).
    pub(super) judged: Option<u64>,
    /// The node's latest registration applied after the judgement, by the revision of its event.
    pub(super) again: Option<u64>,
}

/// A worker's stream as the owner holds it: a bounded queue (what it takes goes on the
/// [`Pipes`]' wire, which the world sends over the simulated network right after the owner's
/// call, and counts until the worker reads it). With [`Options::stream_faults`] the queue holds
/// at most the seed's room (full: `Offer::Full`, as the head's `LinkSender` answers at its
/// bound) and a stream the network closed gives every message back (`Offer::Closed`, as a
/// channel whose receiver is gone), until the leader sees it end
/// ([`World::stream_ended`]). Without them it is never full and never closed: a stream that
/// breaks is forgotten by the leader at once ([`World::break_stream`]).
///
/// [`Options::stream_faults`]: crate::world::Options::stream_faults
#[derive(Debug)]
pub(super) struct SimLink {
    w: usize,
    epoch: u64,
    wire: Wire,
}

impl Outlet<ToWorker> for SimLink {
    fn offer(&self, msg: ToWorker) -> Offer<ToWorker> {
        let stream = (self.w, self.epoch);
        let pipes = &mut *self.wire.borrow_mut();
        if pipes.closed.contains(&stream) {
            pipes.offered_closed += 1;
            return Offer::Closed(msg);
        }
        let size = msg.queued_bytes();
        let bytes = pipes.queued_bytes.get(&stream).copied().unwrap_or(0);
        let depth = pipes.queued.entry(stream).or_default();
        let full = pipes.room.is_some_and(|room| *depth >= room);
        // As `LinkSender::try_send`: full when the message would take the queue past its bytes.
        let full_bytes = pipes
            .room_bytes
            .is_some_and(|limit| bytes.saturating_add(size) > limit);
        if full || full_bytes {
            if !full {
                pipes.full_by_bytes += 1;
            }
            pipes.full.push(stream);
            return Offer::Full;
        }
        *depth += 1;
        *pipes.queued_bytes.entry(stream).or_default() += size;
        if pipes.worker_closed.contains(&stream) {
            pipes.taken_unread += 1;
        }
        pipes.taken.push((self.w, self.epoch, msg));
        Offer::Taken
    }

    fn depth(&self) -> usize {
        let pipes = self.wire.borrow();
        pipes
            .queued
            .get(&(self.w, self.epoch))
            .copied()
            .unwrap_or(0)
    }
}

impl Superseded for ToWorker {
    fn superseded(&self) -> bool {
        matches!(self, ToWorker::Assign { .. } | ToWorker::Cancel { .. })
    }
}

/// The owner's connection number of worker `w`'s stream `epoch`.
fn conn(w: usize, epoch: u64) -> u64 {
    ((w as u64) << 32) | epoch
}

/// The worker and stream epoch of connection `conn`.
fn stream_of(conn: u64) -> (usize, u64) {
    ((conn >> 32) as usize, conn & 0xffff_ffff)
}

/// The simulated time `now` (milliseconds) as [`Liveness`] and the worker's `Protocol` take it.
pub(super) fn clock(now: u64) -> Duration {
    Duration::from_millis(now)
}

/// Whether `replica` leads but cannot now: its disk is full and it has peers that may elect
/// another (the head owner's `cannot_lead_now`).
fn cannot_lead(replica: &SimReplica) -> bool {
    replica.stalled() && replica.members().len() > 1
}

impl World {
    /// The workers' first events and their faults, drawn at the start of the run.
    pub(super) fn start_workers(&mut self) {
        for w in 0..self.options.workers as usize {
            let target = self.random_replica();
            let client = self.clients.len();
            self.clients
                .push(Client::new(worker_client_id(w, 1), target));
            self.workers.push(Worker::new(w, client, target));
            let start = self.rng.random_range(100..1_000);
            self.at(start, Event::Think(client));
            self.at(start, Event::WorkerTick { w, boot: 1 });
            self.at(start, Event::Supervise { w, boot: 1 });
            for _ in 0..self.rng.random_range(0..3) {
                let when = self.rng.random_range(500..self.options.duration_ms);
                self.at(when, Event::WorkerCrash(w));
            }
            for _ in 0..self.rng.random_range(0..3) {
                let when = self.rng.random_range(500..self.options.duration_ms);
                self.at(when, Event::Freeze(w));
            }
            for _ in 0..self.rng.random_range(0..3) {
                let when = self.rng.random_range(500..self.options.duration_ms);
                self.at(when, Event::Cut(w));
            }
            if self.options.stream_faults {
                for _ in 0..self.rng.random_range(0..4) {
                    let when = self.rng.random_range(500..self.options.duration_ms);
                    self.at(when, Event::CloseStream(w));
                }
                for _ in 0..self.rng.random_range(0..3) {
                    let when = self.rng.random_range(500..self.options.duration_ms);
                    self.at(when, Event::StallStream(w));
                }
            }
            if self.options.stream_faults && self.options.half_closes {
                for _ in 0..self.rng.random_range(0..3) {
                    let when = self.rng.random_range(500..self.options.duration_ms);
                    self.at(when, Event::HalfClose { w, head: true });
                }
                for _ in 0..self.rng.random_range(0..3) {
                    let when = self.rng.random_range(500..self.options.duration_ms);
                    self.at(when, Event::HalfClose { w, head: false });
                }
            }
        }
        if self.options.stream_faults {
            // Room for a few heartbeats' answers and a registration's reconcile: a stream that
            // is read fills only while its worker does not read it.
            let room = self.rng.random_range(3..=8);
            self.wire.borrow_mut().room = Some(room);
            if self.options.stream_bytes {
                // Room for one of the largest assignments a client submits and more (the
                // head's `OUTBOX_BYTES` is far above any spec it takes), so a few large ones
                // fill it before its messages do.
                let bytes = self.rng.random_range(8_000..=20_000);
                self.wire.borrow_mut().room_bytes = Some(bytes);
            }
        }
    }

    /// The worker whose writes go through client slot `client`, if any.
    pub(super) fn worker_of(&self, client: usize) -> Option<usize> {
        self.workers.iter().position(|w| w.client == client)
    }

    /// Until when the events of client slot `client` wait (its worker is frozen).
    pub(super) fn client_frozen(&self, client: usize) -> Option<u64> {
        let w = self.worker_of(client)?;
        let until = self.workers[w].frozen_until;
        (until > self.now).then_some(until)
    }

    /// Whether client slot `client` is a worker's cut from every replica now.
    pub(super) fn client_cut(&self, client: usize) -> bool {
        self.worker_of(client)
            .is_some_and(|w| self.workers[w].cut_until > self.now)
    }

    /// A worker's client is idle: its next write (register, register again, a report).
    pub(super) fn worker_think(&mut self, w: usize) {
        let worker = &self.workers[w];
        let client = worker.client;
        if !worker.up || self.clients[client].current.is_some() {
            return;
        }
        let joining = Joining {
            name: worker.name(),
            address: format!("{}.sim:7601", worker.name()),
            resources: format!("cpu={CPUS}").parse().expect("a valid resource set"),
            labels: Labels::new(),
            gpus: Vec::new(),
            boot: worker.boot,
        };
        let (command, intent) = match worker.node {
            None => (
                Command::RegisterNodeUnattached {
                    worker: joining,
                    secret: SecretHash::of(&worker.secret()),
                },
                Intent::Attach { worker: w },
            ),
            Some(node) if !worker.registered => {
                let worker = &mut self.workers[w];
                // It lists what runs and every unacknowledged report; its answer acknowledges
                // the reports it carries.
                let rejoin = worker.protocol.rejoin();
                worker.outbox.clear();
                (
                    Command::RejoinNodeUnattached {
                        worker: joining,
                        back: Returning {
                            cluster: "sim".to_string(),
                            node,
                            secret: SecretHash::of(&worker.secret()),
                            running: rejoin.running,
                            finished: rejoin.finished,
                        },
                    },
                    Intent::Attach { worker: w },
                )
            }
            Some(_) if worker.attached => {
                let worker = &mut self.workers[w];
                // The next report still unacknowledged.
                let Some(report) = std::iter::from_fn(|| worker.outbox.pop_front())
                    .find_map(|key| worker.protocol.unacked(&key).cloned())
                else {
                    return;
                };
                (
                    Command::TaskFinished(report.clone()),
                    Intent::Report {
                        worker: w,
                        task: report.task_id,
                        attempt: report.attempt,
                    },
                )
            }
            Some(_) => return,
        };
        self.note(format!("worker {w} writes {intent:?}"));
        let now = self.elapsed();
        self.clients[client].start(command, intent, now);
        self.send(client);
    }

    /// A worker's write was answered.
    pub(super) fn worker_answered(
        &mut self,
        w: usize,
        intent: &Intent,
        reply: &Result<escher_core::state::Reply, String>,
    ) {
        let replied_by = self.clients[self.workers[w].client].target;
        let worker = &mut self.workers[w];
        match (intent, reply) {
            (Intent::Attach { .. }, Ok(escher_core::state::Reply::Registered(node))) => {
                worker.node = Some(*node);
                worker.registered = true;
                // What it carried is acknowledged; what ended meanwhile is written now.
                let late = worker.protocol.registered();
                worker.outbox = late.iter().map(|r| (r.task_id, r.attempt)).collect();
                worker.target = replied_by;
                worker.last_heard = self.now;
                let (epoch, boot, sent) = (worker.epoch, worker.boot, self.now);
                self.send_to_head(w, boot, epoch, FromWorker::Attach { sent });
            }
            (Intent::Attach { .. }, _) => {
                // Refused (the cluster not named yet, a node forgotten): again, a little later.
                let client = worker.client;
                self.at(100, Event::Think(client));
                return;
            }
            (Intent::Report { task, attempt, .. }, _) => {
                worker.protocol.acked([(*task, *attempt)]);
            }
            _ => {}
        }
        let client = self.workers[w].client;
        self.at(0, Event::Think(client));
    }

    /// A message from worker `w` (boot, stream epoch) to its target replica, over its stream.
    fn send_to_head(&mut self, w: usize, boot: u64, epoch: u64, msg: FromWorker) {
        let to = self.workers[w].target;
        let delays = self.worker_link(w);
        if delays.is_empty() {
            self.break_stream(w, boot, epoch);
            return;
        }
        let delay = delays[0];
        self.at(
            delay,
            Event::AtHead {
                to,
                w,
                boot,
                epoch,
                msg,
            },
        );
    }

    /// The delays of one message on worker `w`'s link (none: lost or cut). A stream delivers
    /// once, in order: a duplicate is the transport's business, not the stream's.
    fn worker_link(&mut self, w: usize) -> Vec<u64> {
        if self.workers[w].cut_until > self.now {
            return Vec::new();
        }
        let mut delays = self.network.weather(&mut self.rng);
        delays.truncate(1);
        delays
    }

    /// The stream of `epoch` broke: the leader holding it forgets it at once, the worker hears
    /// of it a moment later. With the stream faults ([`Options::stream_faults`]) it is closed as
    /// the network closes one ([`World::end_stream`]): the leader too hears of it later.
    ///
    /// [`Options::stream_faults`]: crate::world::Options::stream_faults
    pub(super) fn break_stream(&mut self, w: usize, boot: u64, epoch: u64) {
        if self.options.stream_faults {
            return self.end_stream(w, boot, epoch);
        }
        let broken = conn(w, epoch);
        for slot in self.slots.values_mut() {
            let held: Vec<NodeId> = slot
                .owner
                .conns()
                .filter(|(_, c)| *c == broken)
                .map(|(node, _)| node)
                .collect();
            for node in held {
                slot.owner.detach(node, broken);
            }
        }
        let wait = self.network.max_delay;
        self.at(
            wait,
            Event::ToWorker {
                w,
                boot,
                epoch,
                msg: ToWorker::Broken,
            },
        );
    }

    /// The network closes stream `epoch` of worker `w` (boot `boot`): nothing more crosses it
    /// either way; the worker hears of it within the network's longest delay, and the leader
    /// holding it within twice that ([`World::stream_ended`]). Meanwhile the leader's sends find
    /// the stream's queue closed (`Offer::Closed`, as a channel whose receiver is gone): the
    /// head's `Streams` keeps those messages in the node's outbox for its next stream.
    fn end_stream(&mut self, w: usize, boot: u64, epoch: u64) {
        if !self.wire.borrow_mut().closed.insert((w, epoch)) {
            return; // closed already
        }
        let max = self.network.max_delay;
        let worker_hears = self.rng.random_range(0..=max);
        self.at(
            worker_hears,
            Event::ToWorker {
                w,
                boot,
                epoch,
                msg: ToWorker::Broken,
            },
        );
        let leader_hears = self.rng.random_range(0..=2 * max);
        self.at(leader_hears, Event::StreamEnded { w, epoch });
    }

    /// The leader holding worker `w`'s stream `epoch` sees it end (the owner's `Msg::Detach`):
    /// it forgets it, if it is still the node's current stream.
    pub(super) fn stream_ended(&mut self, w: usize, epoch: u64) {
        let ended = conn(w, epoch);
        for slot in self.slots.values_mut() {
            let held: Vec<NodeId> = slot
                .owner
                .conns()
                .filter(|(_, c)| *c == ended)
                .map(|(node, _)| node)
                .collect();
            for node in held {
                slot.owner.detach(node, ended);
            }
        }
    }

    /// The network closes worker `w`'s current stream (or the next it opens).
    pub(super) fn close_stream(&mut self, w: usize) {
        let worker = &self.workers[w];
        if !self.stormy || !worker.up {
            return;
        }
        if !worker.registered {
            // No stream yet: the fault waits for one.
            return self.at(250, Event::CloseStream(w));
        }
        let (boot, epoch) = (worker.boot, worker.epoch);
        self.stats.stream_closes += 1;
        self.note(format!("the network closes worker {w}'s stream {epoch}"));
        self.end_stream(w, boot, epoch);
    }

    /// Worker `w` stops reading its current stream (or the next it opens) for a while (its process runs on and
    /// heartbeats; what the leader sends piles up in the stream's queue, which may fill).
    pub(super) fn stall_stream(&mut self, w: usize) {
        let worker = &self.workers[w];
        if !self.stormy || !worker.up {
            return;
        }
        if !worker.registered {
            return self.at(250, Event::StallStream(w));
        }
        let epoch = worker.epoch;
        self.stats.stream_stalls += 1;
        let lasts = self.rng.random_range(200..3_000);
        self.note(format!(
            "worker {w} reads nothing of its stream {epoch} for {lasts} ms"
        ));
        let until = self.now + lasts;
        self.wire.borrow_mut().stalled.insert((w, epoch), until);
    }

    /// One side of worker `w`'s current stream (or the next it opens) closes while the other
    /// goes on, as one half of an HTTP/2 stream can end before the other
    /// ([`Options::half_closes`]).
    ///
    /// - `head`: the head's side. The head reads nothing more of the stream (its heartbeats
    ///   are lost) and the leader holding it sees it end at once (the owner's `Msg::Detach`,
    ///   which drops its sending end); the worker still reads what the stream's queue held and
    ///   what was on its way, then finds the stream ended.
    /// - not `head`: the worker's side. The worker finds its stream ended at once and
    ///   registers again; the leader holding it goes on offering it messages, which its queue
    ///   takes (`Offer::Taken`) and nobody reads, until the reset reaches it (within a
    ///   heartbeat timeout: a cut or a slow network delays it): from then its queue is closed
    ///   (`Offer::Closed`), and it sees the stream end within the network's longest delay.
    ///
    /// [`Options::half_closes`]: crate::world::Options::half_closes
    pub(super) fn half_close(&mut self, w: usize, head: bool) {
        let worker = &self.workers[w];
        if !self.stormy || !worker.up {
            return;
        }
        if !worker.registered {
            return self.at(250, Event::HalfClose { w, head });
        }
        if !head && worker.frozen_until > self.now {
            // The worker's side is its process's: it notices once it runs again.
            let wait = worker.frozen_until - self.now;
            return self.at(wait, Event::HalfClose { w, head });
        }
        let (boot, epoch) = (worker.boot, worker.epoch);
        let stream = (w, epoch);
        if self.wire.borrow().closed.contains(&stream) {
            return; // closed at both ends already
        }
        if head {
            if !self.wire.borrow_mut().head_closed.insert(stream) {
                return;
            }
            self.stats.head_half_closes += 1;
            self.note(format!(
                "the head's side of worker {w}'s stream {epoch} closes: the worker reads on"
            ));
            self.stream_ended(w, epoch);
            // After what the queue held and what is on its way, in order.
            self.send_to_worker(w, boot, epoch, ToWorker::Broken);
        } else {
            if !self.wire.borrow_mut().worker_closed.insert(stream) {
                return;
            }
            self.stats.worker_half_closes += 1;
            let lag = self.rng.random_range(0..=HEARTBEAT_TIMEOUT_MS);
            self.note(format!(
                "worker {w}'s side of its stream {epoch} closes: the head sees it in {lag} ms"
            ));
            let worker = &mut self.workers[w];
            worker.detach();
            let client = worker.client;
            self.at(0, Event::Think(client));
            self.at(lag, Event::ResetSeen { w, epoch });
        }
    }

    /// The reset of worker `w`'s stream `epoch`, whose worker's side closed, reaches the head:
    /// its queue is closed now (what the head offers it comes back, `Offer::Closed`), and the
    /// leader holding it sees it end within the network's longest delay.
    pub(super) fn reset_seen(&mut self, w: usize, epoch: u64) {
        if !self.wire.borrow_mut().closed.insert((w, epoch)) {
            return;
        }
        let leader_hears = self.rng.random_range(0..=self.network.max_delay);
        self.at(leader_hears, Event::StreamEnded { w, epoch });
    }

    /// A message of worker `w` reaches replica `to`: the leader's side of the stream.
    pub(super) fn at_head(&mut self, to: u64, w: usize, boot: u64, epoch: u64, msg: FromWorker) {
        let Some(node) = self.workers[w].node else {
            return;
        };
        {
            let pipes = self.wire.borrow();
            if pipes.closed.contains(&(w, epoch)) {
                return; // the network closed the stream: nothing more crosses it
            }
            if pipes.head_closed.contains(&(w, epoch)) {
                return; // the head's side of the stream closed: it reads nothing more of it
            }
        }
        if self.options.trace && matches!(msg, FromWorker::Attach { .. }) {
            self.note(format!("worker {w}'s stream {epoch} reaches replica {to}"));
        }
        let Some(replica) = self.slots[&to].replica.as_ref() else {
            return; // down: the worker hears nothing and finds another
        };
        let hint = replica.leader().filter(|l| *l != to);
        if !replica.is_leader() {
            return self.send_to_worker(w, boot, epoch, ToWorker::Refused(hint));
        }
        let cannot_lead = cannot_lead(replica);
        let now = self.now;
        if let FromWorker::Attach { .. } = msg {
            // The owner's `link_stream`: refused while the disk is full, for a node declared
            // lost, and for one registered with an earlier leadership, whose queue for the
            // node is gone (`head/src/runtime/workers.rs`, "One leadership from registration
            // to stream"; seed 1749): register again.
            let refused = if cannot_lead {
                Some(hint)
            } else if !replica.state().node_alive(node) {
                Some(None)
            } else if !self.slots[&to].owner.registered_here(node) {
                Some(Some(to))
            } else {
                None
            };
            if let Some(hint) = refused {
                return self.send_to_worker(w, boot, epoch, ToWorker::Refused(hint));
            }
        }
        let slot = self.slots.get_mut(&to).expect("every replica has a slot");
        match msg {
            FromWorker::Attach { sent } => {
                // What waited for the node goes on the wire, sent after `Attached`.
                let link = SimLink {
                    w,
                    epoch,
                    wire: Rc::clone(&self.wire),
                };
                slot.owner.attach(node, conn(w, epoch), link, clock(now));
                // A registration admits its node only once its stream is held by a leader
                // (`RegisterNodeUnattached`, `NodeAttached`): nothing is assigned to a node no
                // leader can send to.
                let waits = slot
                    .replica
                    .as_ref()
                    .is_some_and(|r| r.state().waits_for_stream(node));
                if waits && let Some(replica) = slot.replica.as_mut() {
                    let command = Command::NodeAttached { node, boot };
                    let _ = replica.propose(vec![(command, None)], now);
                }
                self.send_to_worker(w, boot, epoch, ToWorker::Attached { sent });
                self.send_wire(to, false);
                if waits {
                    self.drive(to);
                }
            }
            FromWorker::Heartbeat { seq } => {
                if slot.owner.conn(node) != Some(conn(w, epoch)) {
                    // Not the stream this leadership holds (it ended).
                    return self.send_to_worker(w, boot, epoch, ToWorker::Refused(None));
                }
                let Some(replica) = slot.replica.as_ref() else {
                    return;
                };
                match slot
                    .owner
                    .heard(replica.state(), node, clock(now), cannot_lead)
                {
                    // Declared lost: nothing of this stream counts; register again.
                    Heard::Ignored => {
                        self.send_to_worker(w, boot, epoch, ToWorker::Refused(None));
                    }
                    // The head sends the renewal on the stream's queue (`send_now`), which may
                    // find it full, or closed.
                    Heard::Noted { renew: true } if self.options.stream_faults => {
                        let lease = ToWorker::Lease { seq };
                        slot.owner.send_now(node, lease, clock(now));
                        self.send_wire(to, false);
                    }
                    Heard::Noted { renew: true } => {
                        self.send_to_worker(w, boot, epoch, ToWorker::Lease { seq });
                    }
                    // Heard, but no lease while the disk is full.
                    Heard::Noted { renew: false } => {}
                }
            }
        }
    }

    /// Sends `msg` on worker `w`'s stream of `epoch`; a loss breaks the stream.
    fn send_to_worker(&mut self, w: usize, boot: u64, epoch: u64, msg: ToWorker) {
        let delays = self.worker_link(w);
        if delays.is_empty() {
            self.break_stream(w, boot, epoch);
            return;
        }
        // In order: a stream's messages never overtake one another.
        let delay = delays[0].max(self.stream_clock(w, epoch));
        self.worker_streams.insert((w, epoch), self.now + delay);
        self.at(
            delay,
            Event::ToWorker {
                w,
                boot,
                epoch,
                msg,
            },
        );
    }

    /// The delay after which a new message of stream (w, epoch) arrives after the last one.
    fn stream_clock(&self, w: usize, epoch: u64) -> u64 {
        self.worker_streams
            .get(&(w, epoch))
            .map_or(0, |last| last.saturating_sub(self.now))
    }

    /// A replica applied `effects` while leading: its owner sends the workers theirs, on their
    /// streams, keeps them for a node whose stream is not open, or drops them for a node not
    /// alive ([`Streams::send`]); a registration supersedes what was queued for the node and
    /// the stream it had ([`Streams::rejoined`]).
    pub(super) fn perform(&mut self, id: u64, effects: &[Effect]) {
        for effect in effects {
            let (node, msg) = match effect {
                Effect::Assign { node, assignment } => (
                    *node,
                    ToWorker::Assign {
                        task: assignment.task_id,
                        attempt: assignment.attempt,
                        // The head's message for it, as its queue counts it.
                        bytes: HeadMessage::Assign((**assignment).clone()).queued_bytes(),
                    },
                ),
                Effect::Cancel {
                    node,
                    task,
                    attempt,
                    ..
                } => (
                    *node,
                    ToWorker::Cancel {
                        task: *task,
                        attempt: *attempt,
                    },
                ),
                Effect::Rejoined { node } => {
                    let slot = self.slots.get_mut(&id).expect("every replica has a slot");
                    slot.owner.rejoined(*node);
                    continue;
                }
                _ => continue,
            };
            if self.options.trace {
                let link = self.slots[&id].owner.conn(node).map(stream_of);
                self.note(format!(
                    "replica {id} leads: {msg:?} for node {} (stream {link:?})",
                    node.0
                ));
            }
            let now = clock(self.now);
            let slot = self.slots.get_mut(&id).expect("every replica has a slot");
            let Some(replica) = slot.replica.as_ref() else {
                return;
            };
            slot.owner.send(replica.state(), node, msg, now);
            self.send_wire(id, true);
        }
    }

    /// Sends what replica `id`'s owner put on its workers' streams, in order; with
    /// `duplicates`, a storm sends one assignment in ten twice (the worker must run it once).
    fn send_wire(&mut self, id: u64, duplicates: bool) {
        let taken = std::mem::take(&mut self.wire.borrow_mut().taken);
        for (w, epoch, msg) in taken {
            let boot = self.workers[w].boot;
            let twice = duplicates
                && matches!(msg, ToWorker::Assign { .. })
                && self.options.duplicate_assignments
                && self.stormy
                && self.rng.random_ratio(1, 10);
            if twice {
                self.stats.duplicated_assignments += 1;
                self.note(format!("replica {id} sends {msg:?} twice"));
                self.send_to_worker(w, boot, epoch, msg.clone());
            }
            self.send_to_worker(w, boot, epoch, msg);
        }
        self.end_full_streams(id);
    }

    /// The streams replica `id`'s owner found full and dropped (`Streams`' overflow: the
    /// message that found it full is dropped, its lease is renewed no more, and its node is
    /// declared lost a heartbeat timeout later unless it attaches again): as the head's
    /// `LinkSender` dropped, each stream ends for its worker once it has read what the queue
    /// holds, and the worker registers again.
    fn end_full_streams(&mut self, id: u64) {
        let full = std::mem::take(&mut self.wire.borrow_mut().full);
        {
            let pipes = &mut *self.wire.borrow_mut();
            self.stats.offered_closed += std::mem::take(&mut pipes.offered_closed);
            self.stats.stream_full_by_bytes += std::mem::take(&mut pipes.full_by_bytes);
            self.stats.taken_unread += std::mem::take(&mut pipes.taken_unread);
        }
        for (w, epoch) in full {
            self.stats.stream_overflows += 1;
            self.note(format!(
                "replica {id} finds worker {w}'s stream {epoch} full: drops it"
            ));
            let boot = self.workers[w].boot;
            self.send_to_worker(w, boot, epoch, ToWorker::Broken);
        }
    }

    /// Replica `id` leads now, or stopped leading: its soft state starts over; a new leader
    /// gives every live node a whole heartbeat timeout to find it (`Liveness::lead`).
    pub(super) fn owner_lead(&mut self, id: u64, leading: bool) {
        let now = self.now;
        let slot = self.slots.get_mut(&id).expect("every replica has a slot");
        slot.owner.drop_all();
        if leading && let Some(replica) = &slot.replica {
            slot.owner.lead(replica.state(), clock(now));
        }
    }

    /// Replica `id`'s disk filled up (`full`) or has space again, as the owner handles
    /// `Output::DiskFull` (`head/src/runtime/owner/outputs.rs`): a leader of a group that
    /// stalls lets its workers go (their streams end; it renews nothing and declares nothing
    /// until it resumes); one still leading when it resumes gives every live node a whole
    /// heartbeat timeout, as a new leader does.
    pub(super) fn owner_disk(&mut self, id: u64, full: bool) {
        let now = self.now;
        let slot = self.slots.get_mut(&id).expect("every replica has a slot");
        let (stalls, resumes) = (full && !slot.disk_full, !full && slot.disk_full);
        slot.disk_full = full;
        let Some(replica) = slot.replica.as_ref() else {
            return;
        };
        let group = replica.members().len() > 1;
        if !replica.is_leader() || !group {
            return;
        }
        if resumes {
            slot.owner.lead(replica.state(), clock(now));
        } else if stalls && cannot_lead(replica) {
            self.let_workers_go(id);
        }
    }

    /// Replica `id`'s owner ends every worker stream it holds and forgets its workers (it
    /// stops leading, or stops).
    pub(super) fn let_workers_go(&mut self, id: u64) {
        let slot = self.slots.get_mut(&id).expect("every replica has a slot");
        let links = slot.owner.drop_all();
        for (w, epoch) in links.into_iter().map(|(_, c)| stream_of(c)) {
            let boot = self.workers[w].boot;
            self.break_stream(w, boot, epoch);
        }
    }

    /// The leader's tick: a live node unheard for a heartbeat timeout is declared lost
    /// (`Liveness::tick`: its stream forgotten, its removal proposed, naming the registration
    /// judged: `liveness::removal`).
    pub(super) fn owner_tick(&mut self, id: u64) {
        let now = self.now;
        let slot = self.slots.get_mut(&id).expect("every replica has a slot");
        let Some(replica) = slot.replica.as_mut() else {
            return;
        };
        if !replica.is_leader() {
            return;
        }
        let timeout = Duration::from_millis(HEARTBEAT_TIMEOUT_MS);
        let cannot_lead = cannot_lead(replica);
        let silent = slot
            .owner
            .tick(replica.state(), timeout, clock(now), cannot_lead);
        let mut lines = Vec::new();
        for node in &silent {
            self.checker.reset_nodes.insert(*node);
            let reason = format!("no heartbeat for {HEARTBEAT_TIMEOUT_MS} ms");
            let judged = replica.state().registration(*node);
            let command = if self.options.judged_removals {
                let writes = replica.writes_format();
                liveness::removal(replica.state(), *node, reason, writes)
            } else {
                Command::RemoveNode {
                    node: *node,
                    reason,
                }
            };
            if let Ok((index, term)) = replica.propose(vec![(command, None)], now) {
                self.stats.nodes_lost += 1;
                let removal = Removal {
                    node: *node,
                    term,
                    judged,
                    again: None,
                };
                self.removals.insert((id, index), removal);
                lines.push(format!(
                    "replica {id} declares node {} lost (index {index}, registration {judged:?})",
                    node.0
                ));
            }
        }
        for line in lines {
            let running: usize = self.workers.iter().map(Worker::running).sum();
            self.note(format!("{line} (the workers run {running} tasks)"));
        }
        if !silent.is_empty() {
            self.drive(id);
        }
    }

    /// Replica `id` applied the entry at (`index`, `term`), which recorded `events`: the
    /// removals it proposed and has not applied yet note each registration of their node, and
    /// its own removal, if this is one, is checked. A removal that removed its node (a `Lost`
    /// event) after the node's worker registered again removed a registration it never judged:
    /// that registration's tasks were failed and run again elsewhere while its worker may still
    /// run them, or the live node was dropped. Where it changed nothing, it is counted.
    pub(super) fn removal_applied(
        &mut self,
        id: u64,
        index: u64,
        term: u64,
        events: &[WatchEvent],
    ) {
        for (_, removal) in self.removals.range_mut((id, index + 1)..(id + 1, 0)) {
            for e in events {
                // A registration after the judgement has a later revision than the one judged
                // (a replica that restarted replays the ones before: not registrations again).
                if let ClusterEvent::Node { node, change, .. } = &e.event
                    && *node == removal.node
                    && matches!(change, NodeChange::Joined | NodeChange::Rejoined)
                    && removal.judged.is_none_or(|judged| e.revision > judged)
                {
                    removal.again = Some(e.revision);
                }
            }
        }
        let Some(removal) = self.removals.remove(&(id, index)) else {
            return;
        };
        if removal.term != term {
            // Another leader's entry took that index: the removal was never applied.
            return;
        }
        let Some(again) = removal.again else {
            return;
        };
        let removed = events.iter().any(|e| {
            matches!(&e.event, ClusterEvent::Node { node, change: NodeChange::Lost, .. }
                if *node == removal.node)
        });
        if removed {
            self.checker.violations.push(format!(
                "replica {id} declared node {} lost on its registration {:?} and proposed its \
                 removal at index {index}; the node's worker registered again (registration \
                 {again}) before it applied, and the removal removed that registration, which \
                 it never judged",
                removal.node.0, removal.judged
            ));
        } else {
            self.stats.stale_removals += 1;
            self.note(format!(
                "replica {id}'s removal of node {} at index {index}, judged on registration \
                 {:?}, changed nothing: the node registered again ({again})",
                removal.node.0, removal.judged
            ));
        }
    }

    /// A message on worker `w`'s stream arrives.
    pub(super) fn at_worker(&mut self, w: usize, boot: u64, epoch: u64, msg: ToWorker) {
        if self.options.trace && !matches!(msg, ToWorker::Lease { .. }) {
            let now = &self.workers[w];
            let line = format!(
                "worker {w} (boot {boot}, stream {epoch}; now {}, {}) gets {msg:?}",
                now.boot, now.epoch
            );
            self.note(line);
        }
        let worker = &mut self.workers[w];
        if !worker.up || worker.boot != boot || worker.epoch != epoch {
            return; // an older stream, or another process's
        }
        let stream = (w, epoch);
        let stalled = {
            let pipes = self.wire.borrow();
            if pipes.closed.contains(&stream) && !matches!(msg, ToWorker::Broken) {
                return; // the network closed the stream: what was still on it is lost
            }
            pipes.stalled.get(&stream).copied()
        };
        let until = worker.frozen_until.max(stalled.unwrap_or(0));
        if until > self.now {
            // Frozen, or its stream is not read: the message waits, in order.
            self.seq += 1;
            let event = Event::ToWorker {
                w,
                boot,
                epoch,
                msg,
            };
            self.queue.insert((until, self.seq), event);
            return;
        }
        worker.last_heard = self.now;
        if matches!(
            msg,
            ToWorker::Assign { .. } | ToWorker::Cancel { .. } | ToWorker::Lease { .. }
        ) {
            // Read: it leaves the stream's queue (an assignment sent twice leaves it twice).
            let mut pipes = self.wire.borrow_mut();
            if let Some(depth) = pipes.queued.get_mut(&stream) {
                *depth = depth.saturating_sub(1);
            }
            if let Some(bytes) = pipes.queued_bytes.get_mut(&stream) {
                *bytes = bytes.saturating_sub(msg.queued_bytes());
            }
        }
        match msg {
            ToWorker::Attached { sent } => {
                worker.attached = true;
                // The worker tells its fence supervisor the lease (`fence::set_timeout`).
                worker
                    .fence
                    .heard(&format!("l{}", lease_ms()), clock(self.now));
                let lease = Some(clock(lease_ms()));
                let lapsed = worker
                    .protocol
                    .attached(clock(sent), lease, clock(self.now));
                let client = worker.client;
                self.at(0, Event::Think(client));
                if lapsed.is_some() {
                    self.fence(w);
                }
            }
            ToWorker::Lease { seq } => {
                let renewal = worker.protocol.renewed(seq, clock(self.now));
                if renewal.is_some_and(|r| r.lapsed.is_some()) {
                    self.fence(w);
                }
            }
            ToWorker::Refused(hint) => {
                worker.detach();
                worker.target = match hint {
                    Some(leader) => leader,
                    None => self.voters[self.rng.random_range(0..self.voters.len())],
                };
                let client = self.workers[w].client;
                self.clients[client].target = self.workers[w].target;
                self.at(0, Event::Think(client));
            }
            ToWorker::Broken => {
                worker.detach();
                let client = worker.client;
                self.at(0, Event::Think(client));
            }
            ToWorker::Assign { task, attempt, .. } => self.assigned_to(w, task, attempt),
            ToWorker::Cancel { task, attempt } => {
                if let Some(exec) = self.workers[w].protocol.ended(&(task, attempt)) {
                    self.history.ended(exec, self.now, false);
                    self.report(w, task, attempt, Err("cancelled by the head".into()));
                }
            }
        }
    }

    /// Worker `w` got an assignment: it runs it, once, and only under a lease.
    fn assigned_to(&mut self, w: usize, task: escher_proto::types::TaskId, attempt: u32) {
        let worker = &mut self.workers[w];
        let Some(node) = worker.node else { return };
        match worker.protocol.admit((task, attempt), clock(self.now)) {
            // Sent again (a registration's reconciliation, a duplicate): its report goes again
            // if it ended.
            Admit::Again => {
                self.stats.given_again += 1;
                return;
            }
            // An assignment read after the lease ran out is refused: the head may already
            // have given the task to another node.
            Admit::Lapsed { .. } if self.options.fence => {
                let why = "the worker's lease had run out; not started".to_string();
                return self.report(w, task, attempt, Err(why));
            }
            Admit::Lapsed { .. } | Admit::Start => {}
        }
        self.stats.executions += 1;
        let process = (w, worker.boot, self.stats.executions);
        let exec = self.history.started(Execution {
            node,
            process,
            task,
            attempt,
            start: self.now,
            end: None,
            succeeded: false,
        });
        self.workers[w].protocol.run((task, attempt), exec);
        // Most tasks are short; one in ten runs for seconds, long enough to outlive a lease.
        let (low, high) = self.task_ms;
        let lasts = if self.rng.random_ratio(1, 10) {
            self.rng.random_range(1_000..6_000)
        } else {
            self.rng.random_range(low..=high)
        };
        let boot = self.workers[w].boot;
        self.at(lasts, Event::Exit { w, boot, exec });
    }

    /// A task's process exits by itself (also while its worker is frozen).
    pub(super) fn exit(&mut self, w: usize, boot: u64, exec: usize) {
        let worker = &self.workers[w];
        if !worker.up || worker.boot != boot {
            return;
        }
        let Some(key) = worker
            .protocol
            .running()
            .find(|(_, e)| **e == exec)
            .map(|(k, _)| *k)
        else {
            return; // killed already
        };
        self.workers[w].protocol.ended(&key);
        self.history.ended(exec, self.now, true);
        self.report(w, key.0, key.1, Ok(TaskResult::Exited { code: 0 }));
    }

    /// Queues a report of worker `w`'s and wakes its client.
    fn report(
        &mut self,
        w: usize,
        task: escher_proto::types::TaskId,
        attempt: u32,
        outcome: Result<TaskResult, String>,
    ) {
        let worker = &mut self.workers[w];
        worker.protocol.finished(TaskFinished {
            task_id: task,
            attempt,
            outcome,
            timed_out: false,
            output: None,
        });
        worker.outbox.push_back((task, attempt));
        let client = self.workers[w].client;
        self.at(0, Event::Think(client));
    }

    /// The worker's heartbeat tick: a heartbeat on an open stream; a stream whose lease the
    /// head stopped renewing is left for a new registration, as the real worker leaves it
    /// (`Protocol::stale`: more than half the lease without a renewal, before the lease runs
    /// out), and so is a stream that never opened (no `Attached` within [`SILENCE_MS`]: the
    /// transport's own timeout). With the old rules ([`Options::client_rules`] off, which
    /// replays seeds found before them) any [`SILENCE_MS`] without a message leaves an open
    /// stream too.
    ///
    /// [`Options::client_rules`]: crate::world::Options::client_rules
    pub(super) fn worker_tick(&mut self, w: usize, boot: u64) {
        if !self.workers[w].up || self.workers[w].boot != boot {
            return;
        }
        self.at(HEARTBEAT_MS, Event::WorkerTick { w, boot });
        let worker = &self.workers[w];
        if worker.frozen_until > self.now {
            return;
        }
        let silent = self.now.saturating_sub(worker.last_heard) > SILENCE_MS;
        let leave = if !worker.registered {
            None
        } else if !worker.attached || !self.options.client_rules {
            silent.then(|| "heard nothing".to_string())
        } else {
            worker.protocol.stale(clock(self.now)).map(|unrenewed| {
                format!("had its lease unrenewed for {} ms", unrenewed.as_millis())
            })
        };
        if let Some(why) = leave {
            let target = self.random_replica();
            let worker = &mut self.workers[w];
            worker.detach();
            worker.target = target;
            let client = worker.client;
            self.clients[client].target = target;
            self.note(format!("worker {w} {why}: registers again at {target}"));
            self.at(0, Event::Think(client));
            return;
        }
        if worker.attached {
            let worker = &mut self.workers[w];
            let seq = worker.protocol.heartbeat(clock(self.now));
            let epoch = worker.epoch;
            self.send_to_head(w, boot, epoch, FromWorker::Heartbeat { seq });
        }
    }

    /// The fence supervisor, a process of its own (it runs on while the worker is frozen): it
    /// kills every task when the worker's last line's wait ran out (the real supervisor's rule,
    /// `Countdown`). The worker's beat, unless frozen, writes it what is left of the lease
    /// every [`beat_ms`].
    pub(super) fn supervise(&mut self, w: usize, boot: u64) {
        if !self.workers[w].up || self.workers[w].boot != boot {
            return;
        }
        self.at(SUPERVISE_MS, Event::Supervise { w, boot });
        let now = clock(self.now);
        let worker = &mut self.workers[w];
        if worker.frozen_until <= self.now && self.now >= worker.last_beat + beat_ms() {
            worker.last_beat = self.now;
            let lease = clock(lease_ms());
            let line = match worker.protocol.lease_end() {
                Some(end) => format!("h{}", end.saturating_sub(now).min(lease).as_millis()),
                None => "h".to_string(),
            };
            worker.fence.heard(&line, now);
        }
        if worker.fence.due(now) {
            worker.fence.killed(now);
            self.fence(w);
        }
    }

    /// Worker `w`'s lease has run out: its fence kills every task it runs (unless the run has
    /// no fence).
    fn fence(&mut self, w: usize) {
        if !self.options.fence || self.workers[w].running() == 0 {
            return;
        }
        let killed = self.workers[w].protocol.end_all();
        self.note(format!(
            "worker {w}'s lease ran out: its fence kills {} tasks",
            killed.len()
        ));
        for ((task, attempt), exec) in killed {
            self.stats.fenced += 1;
            self.history.ended(exec, self.now, false);
            let why = "stopped by the fence: the worker's lease ran out".to_string();
            self.report(w, task, attempt, Err(why));
        }
    }

    /// Worker `w`'s process dies with every task it runs; it comes back as a new boot.
    pub(super) fn worker_crash(&mut self, w: usize) {
        if !self.stormy || !self.workers[w].up {
            return;
        }
        self.stats.worker_crashes += 1;
        let killed = self.workers[w].protocol.end_all();
        self.note(format!(
            "crash worker {w} ({} tasks die with it)",
            killed.len()
        ));
        for exec in killed.into_values() {
            self.history.ended(exec, self.now, false);
        }
        let client = self.workers[w].client;
        self.clients[client].give_up();
        if let Some(node) = self.workers[w].node {
            self.checker.reset_nodes.insert(node);
        }
        self.workers[w].crash();
        let back = self.rng.random_range(500..5_000);
        self.at(back, Event::WorkerRestart(w));
    }

    /// Worker `w` starts again: a new boot, a new client, its identity kept.
    pub(super) fn worker_restart(&mut self, w: usize) {
        if self.workers[w].up {
            return;
        }
        let target = self.random_replica();
        let client = self.clients.len();
        let worker = &mut self.workers[w];
        worker.boot += 1;
        worker.up = true;
        worker.client = client;
        worker.target = target;
        worker.frozen_until = 0;
        let boot = worker.boot;
        self.clients
            .push(Client::new(worker_client_id(w, boot), target));
        self.note(format!("restart worker {w} (boot {boot})"));
        self.at(0, Event::Think(client));
        self.at(0, Event::WorkerTick { w, boot });
        self.at(0, Event::Supervise { w, boot });
    }

    /// Worker `w` is frozen (SIGSTOP) for a while.
    pub(super) fn freeze(&mut self, w: usize) {
        if !self.stormy || !self.workers[w].up {
            return;
        }
        self.stats.freezes += 1;
        let lasts = self.rng.random_range(300..6_000);
        self.note(format!("freeze worker {w} for {lasts} ms"));
        self.workers[w].frozen_until = self.now + lasts;
    }

    /// Worker `w` is cut from every replica for a while.
    pub(super) fn cut(&mut self, w: usize) {
        if !self.stormy {
            return;
        }
        self.stats.worker_cuts += 1;
        let lasts = self.rng.random_range(300..8_000);
        self.note(format!("cut worker {w} off for {lasts} ms"));
        self.workers[w].cut_until = self.now + lasts;
    }

    /// The quiet end: every worker up, thawed and reachable.
    pub(super) fn calm_workers(&mut self) {
        for w in 0..self.workers.len() {
            self.workers[w].cut_until = 0;
            self.workers[w].frozen_until = self.workers[w].frozen_until.min(self.now);
            if !self.workers[w].up {
                self.worker_restart(w);
            }
        }
    }

    /// The end-of-run judgement of what the workers ran.
    pub(super) fn check_history(&self, state: &escher_core::state::ClusterState) -> Vec<String> {
        let mut acknowledged = Vec::new();
        for client in &self.clients {
            for answered in &client.answered {
                if let (Intent::Submit(names), Ok(escher_core::state::Reply::Submitted(ids))) =
                    (&answered.write.intent, &answered.reply)
                {
                    for (name, id) in names.iter().zip(ids) {
                        acknowledged.push((name.clone(), *id, state.status(*id)));
                    }
                }
            }
        }
        let end = self.history_end.unwrap_or(self.now);
        self.history.check(end, CPUS, &acknowledged)
    }
}

/// A worker's client id, as its keys carry it: one per worker process.
fn worker_client_id(w: usize, boot: u64) -> u64 {
    2_000 + 100 * w as u64 + boot
}
