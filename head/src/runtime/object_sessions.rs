//! [`ObjectSessions`]: the leader's soft state about object sessions (docs/ARCHITECTURE.md
//! "Objects", Lifetime): when each client last renewed its session, so that the objects of a
//! client that died without closing are released.
//!
//! A client renews its session (`RenewObjectSession`) three times per lapse time while it
//! lives. Once a second the leader looks at the sessions that own objects in the table: one it
//! has not heard from for a full lapse time (`--object-session-lapse`, 30 s by default) has
//! lapsed, and the leader proposes `CloseObjectSession` for it, which releases its objects
//! except those a pending or running task takes as an argument. A session that still owns
//! objects after that (pinned ones) is proposed again once one of them is no longer pinned;
//! a proposal in flight is not made again for [`RETRY`].
//!
//! Everything here is soft, like the workers' heartbeats (`workers.rs`): a new leader starts
//! with no renewals and gives every session it finds in the table a full lapse time from when
//! it first looks, so a failover never releases a live client's objects. A client that closes
//! its session (`CloseObjectSession`) is marked lapsed here at once, so that the objects its
//! close had to keep are released as soon as their tasks end. A renewal of a session that
//! owns nothing is forgotten after a lapse time without another.
//!
//! A session owns its `put`s and the result objects of the tasks its client submitted while it
//! was open (`ObjectTable::session_owned`). A task still running when its session ended makes
//! its result afterwards: the leader remembers the last [`MAX_ENDED`] sessions that ended
//! (closed by their client, or lapsed) so that such a result is released at the next check,
//! not a lapse time later. (A new leader does not know them: it gives such a session a full
//! lapse time, as any other.)

use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::time::{Duration, Instant};

use escher_proto::types::ObjectId;

use crate::state::ClusterState;

/// How long a proposed close is not proposed again (its entry is in flight, or was lost with
/// a leadership).
pub(crate) const RETRY: Duration = Duration::from_secs(1);

/// How often the leader looks for lapsed sessions.
pub(crate) const CHECK_EVERY: Duration = Duration::from_secs(1);

/// How many ended sessions the leader remembers, newest kept.
pub(crate) const MAX_ENDED: usize = 10_000;

/// Each session that owns objects in `state`'s table, in order, and whether it owns one that
/// no pending or running task takes as an argument (a close would release something).
pub(crate) fn owning(state: &ClusterState) -> Vec<(u64, bool)> {
    let table = state.objects();
    let sessions = table.sessions_with_objects();
    if sessions.is_empty() {
        return Vec::new();
    }
    let pins: BTreeSet<ObjectId> = state.object_pins();
    sessions
        .into_iter()
        .map(|s| {
            let releasable = table.session_owned(s).iter().any(|id| !pins.contains(id));
            (s, releasable)
        })
        .collect()
}

/// The leader's clocks of the object sessions. See the module documentation.
#[derive(Debug, Default)]
pub(crate) struct ObjectSessions {
    /// When each session was last renewed (or first seen owning objects, or closed: then the
    /// instant a full lapse ago).
    renewed: BTreeMap<u64, Instant>,
    /// When a close of each session was last proposed.
    proposed: BTreeMap<u64, Instant>,
    /// When the leader last looked.
    checked: Option<Instant>,
    /// Sessions that ended (closed, or proposed closed when they lapsed), oldest first, and
    /// the same as a set: one that owns something again is closed at the next check.
    ended: VecDeque<u64>,
    ended_set: BTreeSet<u64>,
}

impl ObjectSessions {
    /// Forgets everything: this replica leads from now on (or no longer does).
    pub(crate) fn lead(&mut self) {
        *self = ObjectSessions::default();
    }

    /// Session `session` was renewed at `now`.
    pub(crate) fn renew(&mut self, session: u64, now: Instant) {
        self.renewed.insert(session, now);
        if self.ended_set.remove(&session) {
            self.ended.retain(|s| *s != session);
        }
    }

    /// Session `session` ended: remembered (the newest [`MAX_ENDED`]).
    fn ended(&mut self, session: u64) {
        if self.ended_set.insert(session) {
            self.ended.push_back(session);
        }
        while self.ended.len() > MAX_ENDED {
            if let Some(old) = self.ended.pop_front() {
                self.ended_set.remove(&old);
            }
        }
    }

    /// Session `session` was closed by its client at `now`: it counts as lapsed from now on, so
    /// that what its close kept (pinned objects) is released once their tasks end.
    pub(crate) fn closed(&mut self, session: u64, lapse: Duration, now: Instant) {
        let long_ago = now.checked_sub(lapse).unwrap_or(now);
        self.renewed.insert(session, long_ago);
        self.proposed.insert(session, now);
        self.ended(session);
    }

    /// Whether it is time to look for lapsed sessions again (once per [`CHECK_EVERY`]).
    pub(crate) fn due(&mut self, now: Instant) -> bool {
        if self
            .checked
            .is_some_and(|at| now.duration_since(at) < CHECK_EVERY)
        {
            return false;
        }
        self.checked = Some(now);
        true
    }

    /// The sessions to close now, of `owning` (each session that owns objects, and whether
    /// one of them is not pinned by a task: [`owning`]): each has not been renewed for `lapse`,
    /// owns an object no task pins, and has no close proposed in the last [`RETRY`]. A session
    /// seen for the first time starts its clock now, unless it ended before (its client closed
    /// it, or it lapsed, and a task of it made a result since): that one is closed again at
    /// once. Each returned session counts as proposed, and as ended.
    pub(crate) fn lapsed(
        &mut self,
        owning: &[(u64, bool)],
        lapse: Duration,
        now: Instant,
    ) -> Vec<u64> {
        let known: BTreeSet<u64> = owning.iter().map(|(s, _)| *s).collect();
        let long_ago = now.checked_sub(lapse).unwrap_or(now);
        for session in &known {
            let first = if self.ended_set.contains(session) {
                long_ago
            } else {
                now
            };
            self.renewed.entry(*session).or_insert(first);
        }
        // A session that owns nothing is remembered for a lapse time after its last renewal
        // (its first put may be on its way), then forgotten.
        self.renewed
            .retain(|s, at| known.contains(s) || now.duration_since(*at) < lapse);
        self.proposed
            .retain(|s, at| known.contains(s) && now.duration_since(*at) < RETRY);
        let mut lapsed = Vec::new();
        for &(session, releasable) in owning {
            let quiet = self
                .renewed
                .get(&session)
                .is_some_and(|at| now.duration_since(*at) >= lapse);
            if !quiet || !releasable || self.proposed.contains_key(&session) {
                continue;
            }
            self.proposed.insert(session, now);
            lapsed.push(session);
        }
        for session in &lapsed {
            self.ended(*session);
        }
        lapsed
    }

    /// How many sessions the leader has a clock for (for tracing).
    pub(crate) fn len(&self) -> usize {
        self.renewed.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const LAPSE: Duration = Duration::from_secs(30);

    #[test]
    fn a_session_lapses_a_full_lapse_after_its_last_renewal_and_is_proposed_once() {
        let mut sessions = ObjectSessions::default();
        let t0 = Instant::now();
        let owning = [(7, true)];
        // First seen: its clock starts.
        assert!(sessions.lapsed(&owning, LAPSE, t0).is_empty());
        sessions.renew(7, t0 + Duration::from_secs(20));
        assert!(
            sessions
                .lapsed(&owning, LAPSE, t0 + Duration::from_secs(40))
                .is_empty(),
            "renewed 20 s ago"
        );
        let at = t0 + Duration::from_secs(50);
        assert_eq!(sessions.lapsed(&owning, LAPSE, at), vec![7]);
        // In flight: not again at once, again after RETRY when it still owns objects.
        assert!(sessions.lapsed(&owning, LAPSE, at).is_empty());
        assert_eq!(sessions.lapsed(&owning, LAPSE, at + RETRY), vec![7]);
    }

    #[test]
    fn a_new_leader_gives_every_session_a_full_lapse() {
        let mut sessions = ObjectSessions::default();
        let t0 = Instant::now();
        let owning = [(7, true), (8, true)];
        sessions.lapsed(&owning, LAPSE, t0);
        sessions.lead();
        let t1 = t0 + LAPSE * 2;
        assert!(sessions.lapsed(&owning, LAPSE, t1).is_empty());
        assert!(
            sessions
                .lapsed(&owning, LAPSE, t1 + LAPSE - Duration::from_millis(1))
                .is_empty()
        );
        assert_eq!(sessions.lapsed(&owning, LAPSE, t1 + LAPSE), vec![7, 8]);
    }

    #[test]
    fn a_session_whose_objects_are_all_pinned_waits_and_a_closed_one_goes_once_unpinned() {
        let mut sessions = ObjectSessions::default();
        let t0 = Instant::now();
        sessions.lapsed(&[(7, false)], LAPSE, t0);
        let t1 = t0 + LAPSE;
        assert!(sessions.lapsed(&[(7, false)], LAPSE, t1).is_empty());
        assert_eq!(sessions.lapsed(&[(7, true)], LAPSE, t1), vec![7]);

        // Closed by its client (its close kept pinned objects): lapsed at once, proposed again
        // once a retry's time has passed and something is no longer pinned.
        sessions.closed(9, LAPSE, t1);
        assert!(sessions.lapsed(&[(9, true)], LAPSE, t1).is_empty());
        assert_eq!(sessions.lapsed(&[(9, true)], LAPSE, t1 + RETRY), vec![9]);
    }

    #[test]
    fn a_session_that_ended_and_owns_a_new_result_is_closed_at_the_next_check() {
        let mut sessions = ObjectSessions::default();
        let t0 = Instant::now();
        // Closed by its client while one of its tasks ran: it owns nothing for a while, and
        // is forgotten but for having ended.
        sessions.closed(7, LAPSE, t0);
        let t1 = t0 + LAPSE * 2;
        assert!(sessions.lapsed(&[], LAPSE, t1).is_empty());
        assert_eq!(sessions.len(), 0);
        // The task's result is made: closed at the next check, not a lapse time later.
        assert_eq!(sessions.lapsed(&[(7, true)], LAPSE, t1 + RETRY), vec![7]);
        // A session never seen before waits its full lapse time.
        assert!(sessions.lapsed(&[(8, true)], LAPSE, t1 + RETRY).is_empty());
        // A lapsed one is remembered as ended too, and one renewed again is not.
        let t2 = t1 + RETRY + LAPSE;
        assert_eq!(sessions.lapsed(&[(8, true)], LAPSE, t2), vec![8]);
        sessions.lapsed(&[], LAPSE, t2 + LAPSE * 2);
        assert_eq!(
            sessions.lapsed(&[(8, true)], LAPSE, t2 + LAPSE * 3),
            vec![8]
        );
        sessions.renew(7, t2 + LAPSE * 3);
        sessions.lapsed(&[], LAPSE, t2 + LAPSE * 5);
        assert!(
            sessions
                .lapsed(&[(7, true)], LAPSE, t2 + LAPSE * 5)
                .is_empty()
        );
    }

    #[test]
    fn renewals_of_sessions_that_own_nothing_are_forgotten_after_a_lapse() {
        let mut sessions = ObjectSessions::default();
        let t0 = Instant::now();
        sessions.renew(5, t0);
        sessions.lapsed(&[], LAPSE, t0 + Duration::from_secs(1));
        assert_eq!(sessions.len(), 1);
        sessions.lapsed(&[], LAPSE, t0 + LAPSE);
        assert_eq!(sessions.len(), 0);
    }

    #[test]
    fn the_check_runs_once_a_second() {
        let mut sessions = ObjectSessions::default();
        let t0 = Instant::now();
        assert!(sessions.due(t0));
        assert!(!sessions.due(t0 + Duration::from_millis(500)));
        assert!(sessions.due(t0 + CHECK_EVERY));
    }
}
