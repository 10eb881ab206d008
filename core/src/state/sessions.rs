//! Idempotency: the replies of each client's recent writes, so that a write retried after
//! its reply was lost is answered again instead of applied again.
//!
//! A write that carries a [`RequestKey`] (client id, sequence number, and the client's
//! `first_incomplete`) is looked up first: if the state recorded a reply for that client and
//! sequence number, the reply is returned and nothing is applied. Otherwise the command is
//! applied, and a success is recorded. A refusal is not recorded: a refused command changed
//! nothing, so applying its retry cannot duplicate anything.
//!
//! The window is bounded and deterministic (driven by [`Entry::now`](super::Entry) and
//! counts, never by a clock read here):
//! - a client's replies below its latest `first_incomplete` are forgotten at once (the client
//!   says it has them);
//! - at most [`MAX_REPLIES_PER_CLIENT`] replies per client are kept, the oldest going first;
//! - a client that has sent no keyed write for [`SESSION_IDLE_MS`] is forgotten, and at most
//!   [`MAX_SESSIONS`] clients are remembered, the least recently active going first.
//!
//! A retry whose reply was forgotten under the first rule is refused
//! ([`ApplyError::ReplyForgotten`]); under the other two it is applied again. The client
//! library retries for seconds, well inside the window.

use std::collections::{BTreeMap, BTreeSet};

use escher_proto::types::RequestKey;
use serde::{Deserialize, Serialize};

use super::command::Reply;
use super::error::ApplyError;
use crate::scheduler::Millis;

/// How long (by the entries' clock) a client's replies are kept after its last keyed write.
pub const SESSION_IDLE_MS: Millis = 10 * 60 * 1000;
/// The most replies kept per client.
pub const MAX_REPLIES_PER_CLIENT: usize = 4096;
/// The most clients remembered at once.
pub const MAX_SESSIONS: usize = 100_000;

/// What the state knows of a keyed write.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Seen {
    /// Never applied (or forgotten with its client): apply it.
    New,
    /// Applied before: this was its reply.
    Replied(Reply),
}

/// One client's recorded replies.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
struct Session {
    /// When it last sent a keyed write (`Entry::now`).
    last_active: Millis,
    /// Its highest `first_incomplete`: replies below it are gone.
    floor: u64,
    /// Replies by sequence number.
    replies: BTreeMap<u64, Reply>,
}

/// Every remembered client. See the [module documentation](self).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub(crate) struct Sessions {
    clients: BTreeMap<u64, Session>,
    /// `(last_active, client)`, to forget idle clients oldest first.
    by_activity: BTreeSet<(Millis, u64)>,
}

impl Sessions {
    /// Whether `key`'s write was applied before, and its reply if it is still kept.
    pub(crate) fn seen(&self, key: &RequestKey) -> Result<Seen, ApplyError> {
        let Some(session) = self.clients.get(&key.client) else {
            return Ok(Seen::New);
        };
        if let Some(reply) = session.replies.get(&key.seq) {
            return Ok(Seen::Replied(reply.clone()));
        }
        if key.seq < session.floor {
            return Err(ApplyError::ReplyForgotten {
                client: key.client,
                seq: key.seq,
            });
        }
        Ok(Seen::New)
    }

    /// Records the reply of `key`'s write, applied at `now`, and forgets what falls out of the
    /// window.
    pub(crate) fn record(&mut self, key: &RequestKey, reply: Reply, now: Millis) {
        let session = self.clients.entry(key.client).or_default();
        self.by_activity.remove(&(session.last_active, key.client));
        session.last_active = session.last_active.max(now);
        self.by_activity.insert((session.last_active, key.client));
        if key.first_incomplete > session.floor {
            session.floor = key.first_incomplete;
            session.replies = session.replies.split_off(&session.floor);
        }
        session.replies.insert(key.seq, reply);
        while session.replies.len() > MAX_REPLIES_PER_CLIENT {
            session.replies.pop_first();
        }
        self.expire(now);
    }

    /// Forgets clients idle for longer than the window, and the least recently active ones
    /// beyond the limit.
    fn expire(&mut self, now: Millis) {
        while let Some(&(last, client)) = self.by_activity.first() {
            let idle = now.saturating_sub(last) > SESSION_IDLE_MS;
            if !idle && self.by_activity.len() <= MAX_SESSIONS {
                break;
            }
            self.by_activity.pop_first();
            self.clients.remove(&client);
        }
    }

    /// How many clients are remembered.
    #[cfg(test)]
    pub(crate) fn len(&self) -> usize {
        self.clients.len()
    }
}

#[cfg(test)]
mod tests {
    use escher_proto::types::TaskId;

    use super::*;

    fn key(client: u64, seq: u64, first_incomplete: u64) -> RequestKey {
        RequestKey {
            client,
            seq,
            first_incomplete,
        }
    }

    fn submitted(id: u64) -> Reply {
        Reply::Submitted(vec![TaskId(id)])
    }

    #[test]
    fn a_retry_gets_the_recorded_reply() {
        let mut s = Sessions::default();
        assert_eq!(s.seen(&key(7, 1, 1)).unwrap(), Seen::New);
        s.record(&key(7, 1, 1), submitted(1), 100);
        assert_eq!(s.seen(&key(7, 1, 1)).unwrap(), Seen::Replied(submitted(1)));
        // Another client with the same sequence number is another write.
        assert_eq!(s.seen(&key(8, 1, 1)).unwrap(), Seen::New);
    }

    #[test]
    fn first_incomplete_releases_answered_replies() {
        let mut s = Sessions::default();
        for seq in 1..=3 {
            s.record(&key(7, seq, 1), submitted(seq), 100);
        }
        s.record(&key(7, 4, 3), submitted(4), 100);
        let err = s.seen(&key(7, 2, 3)).unwrap_err();
        assert!(matches!(
            err,
            ApplyError::ReplyForgotten { client: 7, seq: 2 }
        ));
        assert_eq!(s.seen(&key(7, 3, 3)).unwrap(), Seen::Replied(submitted(3)));
    }

    #[test]
    fn idle_clients_and_old_replies_are_forgotten() {
        let mut s = Sessions::default();
        s.record(&key(1, 1, 1), submitted(1), 0);
        s.record(&key(2, 1, 1), submitted(2), SESSION_IDLE_MS + 1);
        assert_eq!(s.len(), 1, "client 1 was idle for longer than the window");
        assert_eq!(s.seen(&key(1, 1, 1)).unwrap(), Seen::New);
        for seq in 1..=(MAX_REPLIES_PER_CLIENT as u64 + 10) {
            s.record(&key(3, seq, 1), submitted(seq), SESSION_IDLE_MS + 2);
        }
        assert_eq!(s.seen(&key(3, 1, 1)).unwrap(), Seen::New, "the oldest went");
        let last = MAX_REPLIES_PER_CLIENT as u64 + 10;
        assert_eq!(
            s.seen(&key(3, last, 1)).unwrap(),
            Seen::Replied(submitted(last))
        );
    }
}
