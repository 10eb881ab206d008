//! [`Protocol`]: the worker's side of its protocol with the head, with the time passed in:
//! which assignments it starts, what a registration lists, which reports it keeps until the
//! head acknowledges them, when its lease holds and when it has run out.
//!
//! It reads no clock, runs no task and does no I/O: the worker's event loop (`runtime.rs`)
//! passes the time since an origin of its own and does what the answers say (spawn a runner,
//! send a message, end what the fence must end), and the deterministic simulation
//! (`escher-sim`) passes its simulated time, so both run these rules and a bug in them is found
//! seed by seed. It is the worker's counterpart of the head's `Liveness`.
//!
//! The rules (DESIGN §13, `runtime.rs`'s module documentation):
//!
//! - an attempt runs at most once per worker process: an assignment of a (task, attempt) this
//!   process runs, was given before (run, refused or reported), or ran recently
//!   ([`RECENT_ATTEMPTS`]) is not started again ([`Admit::Again`]); a head whose state was
//!   restored from a backup lets the ended ones be forgotten ([`Protocol::forget_ended`]);
//! - an assignment is started only while the lease holds: one read after it ran out is
//!   refused ([`Admit::Lapsed`]), as the head may already have given the attempt to another
//!   node;
//! - every report (`TaskFinished`) is kept until the head acknowledges it
//!   ([`Protocol::acked`]); a registration lists what runs and every unacknowledged report
//!   ([`Protocol::rejoin`]), and its answer acknowledges those it carried
//!   ([`Protocol::registered`]: the others are sent again at once);
//! - the lease runs for the period the head grants from when the worker sent what the head
//!   answered: the registration ([`Protocol::attached`]) or a heartbeat
//!   ([`Protocol::heartbeat`], [`Protocol::renewed`]); it never moves back;
//! - once it has run out ([`Protocol::lapsed`]), the fence ends what runs; a renewal that comes
//!   after it ran out first says so, so that the fence ends what ran under the old lease
//!   before the new one keeps it alive;
//! - a replica that has not renewed the lease for half of it is left for another
//!   ([`Protocol::stale`]), before the lease runs out.
//!
//! `T` is what the caller keeps about each running attempt (the worker's runner handle, the
//! simulation's execution number).

use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::time::Duration;

use escher_proto::types::{RunningTask, TaskFinished, TaskId};

/// An attempt of a task: what the head assigns and the worker reports.
pub type Attempt = (TaskId, u32);

/// How many ended attempts a worker remembers, to refuse running one again.
pub const RECENT_ATTEMPTS: usize = 65_536;

/// The most heartbeats remembered while waiting for the leader to renew the lease.
pub const BEATS_KEPT: usize = 256;

/// What to do with an assignment ([`Protocol::admit`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Admit {
    /// Start it (then [`Protocol::run`] it, or report why it could not start).
    Start,
    /// Given before: not started again (its report, if any, is already kept).
    Again,
    /// Read after the lease ran out, `silent` after its last renewal: refuse it with a report,
    /// unstarted.
    Lapsed {
        /// How long the lease has gone without renewal.
        silent: Duration,
    },
}

/// A renewal of the lease ([`Protocol::renewed`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Renewal {
    /// When the renewed heartbeat was sent: the lease runs from then.
    pub sent: Duration,
    /// How long the lease had gone without renewal, if it had run out before this renewal:
    /// the fence ends what runs first.
    pub lapsed: Option<Duration>,
}

/// What a registration lists ([`Protocol::rejoin`]).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Rejoin {
    /// The attempts that run.
    pub running: Vec<RunningTask>,
    /// Every report the head has not acknowledged.
    pub finished: Vec<TaskFinished>,
}

/// The attempts ended longest ago are forgotten first.
#[derive(Debug, Default)]
struct Recent {
    set: BTreeSet<Attempt>,
    order: VecDeque<Attempt>,
}

impl Recent {
    fn insert(&mut self, key: Attempt) {
        if self.set.insert(key) {
            self.order.push_back(key);
            if self.order.len() > RECENT_ATTEMPTS
                && let Some(old) = self.order.pop_front()
            {
                self.set.remove(&old);
            }
        }
    }
}

/// A worker process's side of its protocol with the head. See the [module
/// documentation](self).
#[derive(Debug)]
pub struct Protocol<T> {
    /// What runs, and what the caller keeps about it.
    running: BTreeMap<Attempt, T>,
    /// Attempts this process was given (run or refused), to refuse running one twice.
    given: Recent,
    /// Reports the head has not acknowledged.
    unacked: BTreeMap<Attempt, TaskFinished>,
    /// The reports the registration under way carries: its answer acknowledges them.
    carried: BTreeSet<Attempt>,
    /// The lease the head grants (kept while no stream is attached).
    lease: Option<Duration>,
    /// When the worker sent what the leader last renewed the lease for.
    renewed: Option<Duration>,
    /// The number of the last heartbeat (counted across streams).
    heartbeat_seq: u64,
    /// Heartbeats sent on this stream and not yet renewed, with when they were sent.
    beats: VecDeque<(u64, Duration)>,
}

impl<T> Default for Protocol<T> {
    fn default() -> Self {
        Protocol::new()
    }
}

impl<T> Protocol<T> {
    /// A new worker process's: nothing runs, nothing is owed, no lease yet.
    pub fn new() -> Protocol<T> {
        Protocol {
            running: BTreeMap::new(),
            given: Recent::default(),
            unacked: BTreeMap::new(),
            carried: BTreeSet::new(),
            lease: None,
            renewed: None,
            heartbeat_seq: 0,
            beats: VecDeque::new(),
        }
    }

    // Attempts.

    /// An assignment of `key` arrived at `now`: whether to start it. Every attempt given is
    /// remembered, started or refused, so that it never starts twice.
    pub fn admit(&mut self, key: Attempt, now: Duration) -> Admit {
        if self.running.contains_key(&key) || self.given.set.contains(&key) {
            return Admit::Again;
        }
        self.given.insert(key);
        match self.lapsed(now) {
            Some(silent) => Admit::Lapsed { silent },
            None => Admit::Start,
        }
    }

    /// `key`, admitted, runs now; the caller keeps `value` about it.
    pub fn run(&mut self, key: Attempt, value: T) {
        self.running.insert(key, value);
    }

    /// What the caller keeps about running attempt `key`.
    pub fn get(&self, key: &Attempt) -> Option<&T> {
        self.running.get(key)
    }

    /// Whether `key` runs.
    pub fn runs(&self, key: &Attempt) -> bool {
        self.running.contains_key(key)
    }

    /// The attempts that run, in order.
    pub fn running(&self) -> impl Iterator<Item = (&Attempt, &T)> {
        self.running.iter()
    }

    /// How many attempts run.
    pub fn running_count(&self) -> usize {
        self.running.len()
    }

    /// `key` stopped running (its report goes through [`Protocol::finished`]).
    pub fn ended(&mut self, key: &Attempt) -> Option<T> {
        self.running.remove(key)
    }

    /// Every running attempt stops (the fence killed them all, or the head no longer knows
    /// this node); returns them in order.
    pub fn end_all(&mut self) -> BTreeMap<Attempt, T> {
        std::mem::take(&mut self.running)
    }

    /// The head's state was restored from a backup: the attempts given before are forgotten
    /// (it never sends again one that ran after the backup), what runs still runs once.
    pub fn forget_ended(&mut self) {
        self.given = Recent::default();
    }

    /// The head group does not know this node any more: what it ran and reported is no one's.
    /// Returns what ran, for the caller to cancel.
    pub fn forget_all(&mut self) -> BTreeMap<Attempt, T> {
        self.given = Recent::default();
        self.unacked.clear();
        self.carried.clear();
        self.end_all()
    }

    // Reports.

    /// An attempt ended (or was refused): its report is kept until acknowledged; the caller
    /// sends it if a stream is attached.
    pub fn finished(&mut self, report: TaskFinished) {
        self.unacked
            .insert((report.task_id, report.attempt), report);
    }

    /// The unacknowledged report of `key`, if any.
    pub fn unacked(&self, key: &Attempt) -> Option<&TaskFinished> {
        self.unacked.get(key)
    }

    /// How many reports wait for the head's acknowledgement.
    pub fn unacked_count(&self) -> usize {
        self.unacked.len()
    }

    /// The head acknowledged these reports (committed them).
    pub fn acked(&mut self, keys: impl IntoIterator<Item = Attempt>) {
        for key in keys {
            self.unacked.remove(&key);
        }
    }

    /// A registration is sent: what it lists. Its answer acknowledges the reports listed
    /// ([`Protocol::registered`]).
    pub fn rejoin(&mut self) -> Rejoin {
        self.carried = self.unacked.keys().copied().collect();
        Rejoin {
            running: self
                .running
                .keys()
                .map(|&(task_id, attempt)| RunningTask { task_id, attempt })
                .collect(),
            finished: self.unacked.values().cloned().collect(),
        }
    }

    /// The registration was answered: the reports it carried are acknowledged; returns the
    /// others (ended while it was under way), to send now.
    pub fn registered(&mut self) -> Vec<TaskFinished> {
        for key in std::mem::take(&mut self.carried) {
            self.unacked.remove(&key);
        }
        self.unacked.values().cloned().collect()
    }

    // The lease.

    /// The period of the lease the head grants, once a registration said.
    pub fn lease(&self) -> Option<Duration> {
        self.lease
    }

    /// When the lease runs out unless renewed, if there is one.
    pub fn lease_end(&self) -> Option<Duration> {
        Some(self.renewed? + self.lease?)
    }

    /// How long the lease has gone without renewal at `now`, once that is the lease or more:
    /// it has run out, and the fence ends what runs. `None` while it holds (or before any).
    pub fn lapsed(&self, now: Duration) -> Option<Duration> {
        let (lease, renewed) = (self.lease?, self.renewed?);
        let silent = now.saturating_sub(renewed);
        (silent >= lease).then_some(silent)
    }

    /// Whether the lease holds at `now`.
    pub fn leased(&self, now: Duration) -> bool {
        self.lease.is_some() && self.renewed.is_some() && self.lapsed(now).is_none()
    }

    /// How long the lease has gone without renewal at `now`, once that is more than half of
    /// it: the replica is left for another, before the lease runs out.
    pub fn stale(&self, now: Duration) -> Option<Duration> {
        let (lease, renewed) = (self.lease?, self.renewed?);
        let silent = now.saturating_sub(renewed);
        (silent > lease / 2).then_some(silent)
    }

    /// A stream opened at `now` after a registration sent at `sent`, with the lease period the
    /// head grants (if it said): the lease runs from `sent`. Returns how long the lease had
    /// gone without renewal if it had run out first: the fence must end what runs before the
    /// new lease keeps it alive.
    pub fn attached(
        &mut self,
        sent: Duration,
        lease: Option<Duration>,
        now: Duration,
    ) -> Option<Duration> {
        let lapsed = self.lapsed(now);
        self.lease = lease;
        self.renew(sent);
        self.beats.clear();
        lapsed
    }

    /// A heartbeat is sent at `now`: its number, which the leader's renewal names.
    pub fn heartbeat(&mut self, now: Duration) -> u64 {
        self.heartbeat_seq += 1;
        if self.beats.len() == BEATS_KEPT {
            self.beats.pop_front();
        }
        self.beats.push_back((self.heartbeat_seq, now));
        self.heartbeat_seq
    }

    /// The leader renewed the lease for heartbeat `seq`, heard at `now`: the lease runs from
    /// when that heartbeat was sent (earlier ones are forgotten). `None` for a heartbeat not
    /// remembered (renewed already, or of an earlier stream).
    pub fn renewed(&mut self, seq: u64, now: Duration) -> Option<Renewal> {
        while let Some(&(sent_seq, sent)) = self.beats.front() {
            if sent_seq > seq {
                break;
            }
            self.beats.pop_front();
            if sent_seq == seq {
                let lapsed = self.lapsed(now);
                self.renew(sent);
                return Some(Renewal { sent, lapsed });
            }
        }
        None
    }

    fn renew(&mut self, sent: Duration) {
        self.renewed = Some(self.renewed.map_or(sent, |r| r.max(sent)));
    }
}

#[cfg(test)]
mod tests;
