//! A client's object session (docs/ARCHITECTURE.md "Objects", Lifetime): the number the head
//! gave with the client's first `put`, which owns every object the client puts.
//!
//! One background task per client, started with its first `put`, does three things:
//!
//! - it sends the ids whose last [`ObjectRef`](super::ObjectRef) was dropped, in batches
//!   (`ReleaseObjects`);
//! - it renews the session (`RenewObjectSession`) three times per lapse time, which the head
//!   names in each answer (30 s unless the head's `--object-session-lapse` says otherwise): a
//!   session not renewed for a lapse time is closed by the head, its objects released, so a
//!   client that dies without closing (SIGKILL) leaks nothing;
//! - once the client and every reference are gone, it closes the session
//!   (`CloseObjectSession`), releasing at once whatever the session still owns.
//!
//! [`Client::close_object_session`] closes it now, whatever references remain: their objects
//! are freed (a later `get` says so), and the client's next `put` opens a new session.
//!
//! The session owns the results of the client's tasks too: every task submitted while a
//! session is open carries it (the label `escher.object-session`), and a result the head keeps
//! as an object (a function's result above 100 KiB) goes when the session ends, as the
//! client's `put`s go. A client opens its session with its first `put`, or before it with
//! [`Client::open_object_session`] (a driver does: the Python package's `escher.init`). A
//! client that has neither has no session: its tasks' result objects stay until their
//! reference's owner releases them (`Client::result_ref`), as an `escher submit`'s do.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use escher_proto::TaskId;
use escher_proto::convert::object_id;
use escher_proto::types::{OBJECT_SESSION_LABEL, ObjectId, TaskSpec};
use escher_proto::wire;
use tokio::sync::{Mutex, mpsc};
use tokio::time::Instant;

use crate::{Client, ClientError};

/// The most ids one `ReleaseObjects` call carries.
const MAX_RELEASE_BATCH: usize = 10_000;

/// When the first renewal goes, before the head has named its lapse time (the shortest lapse
/// a head takes is 1 s).
const FIRST_RENEWAL: Duration = Duration::from_millis(300);

/// The shortest and the longest pause between renewals.
const RENEWAL_PAUSE: (Duration, Duration) = (Duration::from_millis(250), Duration::from_secs(10));

/// The object session of a task's caller, which a client speaking for that task puts into
/// ([`Client::within_object_session`]): the session, and the indexes of its own there.
///
/// The caller's client counts its indexes from 0; a task's are
/// `2^63 | task << 26 | attempt << 20 | n`, `n` below 2^20: a range no other task (or attempt
/// of the same task) of the session shares, so two never choose one id. (An attempt's puts
/// may outlive it, and an id freed is never put again.)
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CallerSession {
    /// The caller's object session.
    pub session: u64,
    /// The first index of this task attempt's range.
    pub first: u64,
    /// How many indexes the range holds.
    pub count: u64,
}

impl CallerSession {
    /// The range of attempt `attempt` of task `task` in session `session`; `None` for no
    /// session (0), a task id of 2^37 or more, or an attempt of 64 or more (such a task puts
    /// into a session of its own).
    pub fn of_task(session: u64, task: TaskId, attempt: u32) -> Option<CallerSession> {
        if session == 0 || task.0 >= 1 << 37 || attempt >= 64 {
            return None;
        }
        Some(CallerSession {
            session,
            first: 1 << 63 | task.0 << 26 | u64::from(attempt) << 20,
            count: 1 << 20,
        })
    }
}

/// A client's objects: its session, the next index, and the queue of releases.
#[derive(Debug)]
pub(crate) struct Puts {
    /// The object session the head gave this client (0: none yet); held while the first put
    /// opens one, and while a close ends it.
    pub(super) session: Mutex<u64>,
    /// The same number, for the background task that renews it (0: none).
    opened: Arc<AtomicU64>,
    /// The next object index.
    pub(super) next: AtomicU64,
    /// Ids whose last reference was dropped, to the background task.
    pub(super) releases: mpsc::UnboundedSender<ObjectId>,
}

impl Puts {
    /// A client's object state, its background task started (in the caller's runtime).
    pub(crate) fn start(client: Client) -> Puts {
        let (tx, rx) = mpsc::unbounded_channel();
        let opened = Arc::new(AtomicU64::new(0));
        tokio::spawn(keep(client, Arc::clone(&opened), rx));
        Puts {
            session: Mutex::new(0),
            opened,
            next: AtomicU64::new(0),
            releases: tx,
        }
    }

    /// The head gave this client session `session`: it is renewed from now on.
    pub(super) fn opened(&self, session: u64) {
        self.opened.store(session, Ordering::Release);
    }

    /// The session open now (0: none).
    fn open_now(&self) -> u64 {
        self.opened.load(Ordering::Acquire)
    }
}

/// What closing an object session did ([`Client::close_object_session`]).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ClosedSession {
    /// The session closed (0: the client had none).
    pub session: u64,
    /// The objects released: its tasks' results, then its `put`s, in id order.
    pub released: Vec<ObjectId>,
    /// The objects a pending or running task takes as an argument: released once that task
    /// ends.
    pub pinned: Vec<ObjectId>,
}

/// The background task: releases in batches and renews the session until every sender (the
/// client's state and every ref) is gone, then closes the session. A failed release or
/// renewal is logged: the objects stay until the session ends.
async fn keep(client: Client, opened: Arc<AtomicU64>, mut rx: mpsc::UnboundedReceiver<ObjectId>) {
    let mut pause = FIRST_RENEWAL;
    let mut renew_at = Instant::now() + pause;
    loop {
        tokio::select! {
            got = rx.recv() => {
                let Some(first) = got else { break };
                let mut ids = vec![first];
                while ids.len() < MAX_RELEASE_BATCH {
                    match rx.try_recv() {
                        Ok(id) => ids.push(id),
                        Err(_) => break,
                    }
                }
                if let Err(err) = client.release_objects(&ids).await {
                    tracing::warn!(count = ids.len(), %err, "could not release objects");
                }
            }
            () = tokio::time::sleep_until(renew_at) => {
                let session = opened.load(Ordering::Acquire);
                if session != 0 {
                    match client.renew_object_session(session).await {
                        Ok(lapse) => pause = (lapse / 3).clamp(RENEWAL_PAUSE.0, RENEWAL_PAUSE.1),
                        Err(err) => {
                            tracing::warn!(session, %err, "could not renew the object session");
                        }
                    }
                }
                renew_at = Instant::now() + pause;
            }
        }
    }
    // The client and every reference are gone: nothing can name the session's objects.
    let session = opened.swap(0, Ordering::AcqRel);
    if session != 0
        && let Err(err) = client.close_session(session).await
    {
        tracing::warn!(session, %err, "could not close the object session; it lapses");
    }
}

impl Client {
    /// Ends this client's object session now: every object it put, and the result object of
    /// every task it submitted while the session was open, is released at once (its copies
    /// deleted), whatever [`ObjectRef`](super::ObjectRef)s remain, except the objects a
    /// pending or running task takes as an argument, released once that task ends (a result
    /// made after the close goes when it is made). A client
    /// that never put has nothing to close. The next `put` opens a new session. (Dropping the
    /// client and every reference closes it too, in the background; a client that dies
    /// without either is closed by the head once its session lapses.)
    pub async fn close_object_session(&self) -> Result<ClosedSession, ClientError> {
        let Some(puts) = self.puts_started() else {
            return Ok(ClosedSession::default());
        };
        let mut session = puts.session.lock().await;
        if *session == 0 {
            return Ok(ClosedSession::default());
        }
        let closed = self.close_session(*session).await?;
        *session = 0;
        puts.opened(0);
        Ok(closed)
    }

    /// Opens this client's object session now, if it has none, and returns its number. A
    /// client opens one with its first `put` anyway; one that may never put but submits tasks
    /// with large results (a driver: the Python package's `escher.init` does this) opens it
    /// first, so that those results are the session's and go when the client closes, drops or
    /// dies (its session lapsing), not only when their references are released. Not for a
    /// one-shot submitter whose results must outlive it (`escher submit`).
    pub async fn open_object_session(&self) -> Result<u64, ClientError> {
        if let Some(caller) = self.caller_session() {
            return Ok(caller.session);
        }
        let puts = self.puts();
        let mut session = puts.session.lock().await;
        if *session == 0 {
            let reply = self
                .call(|mut rpc| {
                    let request = wire::ObjectSessionRequest {
                        session: 0,
                        namespace: self.namespace_text(),
                    };
                    async move { rpc.open_object_session(request).await }
                })
                .await?;
            *session = reply.session;
            puts.opened(reply.session);
        }
        Ok(*session)
    }

    /// A new object id of this client's object session (opened first if it has none), for an
    /// object this client will own but not put: an actor call's result kept where it was made
    /// (`actors.rs`).
    pub(crate) async fn new_session_object(&self) -> Result<ObjectId, ClientError> {
        let puts = self.puts();
        // With a session open, no await: a handle's calls keep the order they were made in.
        let mut session = puts.open_now();
        if session == 0 {
            session = self.open_object_session().await?;
        }
        let index = puts.next.fetch_add(1, Ordering::Relaxed);
        Ok(ObjectId(session, index))
    }

    /// Labels `spec` with this client's object session, when one is open
    /// ([`OBJECT_SESSION_LABEL`]): the task's result object, if it has one, goes when the
    /// session ends. A client that never put leaves the spec as it is.
    pub(crate) fn label_object_session(&self, spec: &mut TaskSpec) -> Result<(), ClientError> {
        // A task's client labels with its caller's session: what its tasks return is the
        // caller's, as what it puts is.
        let session = match self.caller_session() {
            Some(caller) => caller.session,
            None => self.puts_started().map_or(0, Puts::open_now),
        };
        if session != 0 {
            spec.labels
                .insert(OBJECT_SESSION_LABEL, &session.to_string())?;
        }
        Ok(())
    }

    /// Renews object session `session`; returns how long it lives without another renewal.
    async fn renew_object_session(&self, session: u64) -> Result<Duration, ClientError> {
        let reply = self
            .call(|mut rpc| {
                let request = wire::ObjectSessionRequest {
                    session,
                    namespace: self.namespace_text(),
                };
                async move { rpc.renew_object_session(request).await }
            })
            .await?;
        Ok(Duration::from_millis(reply.lapse_ms))
    }

    /// Closes object session `session`.
    async fn close_session(&self, session: u64) -> Result<ClosedSession, ClientError> {
        let reply = self
            .call(|mut rpc| {
                let request = wire::ObjectSessionRequest {
                    session,
                    namespace: self.namespace_text(),
                };
                async move { rpc.close_object_session(request).await }
            })
            .await?;
        let ids = |keys: Vec<wire::ObjectKey>, what: &str| {
            keys.into_iter()
                .map(|k| object_id(Some(k), what))
                .collect::<Result<Vec<_>, _>>()
        };
        Ok(ClosedSession {
            session,
            released: ids(reply.released, "released")?,
            pinned: ids(reply.pinned, "pinned")?,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_tasks_range_is_its_own_in_its_callers_session() {
        let a = CallerSession::of_task(1 << 63, TaskId(5), 0).expect("a range");
        let retried = CallerSession::of_task(1 << 63, TaskId(5), 1).expect("a range");
        let next = CallerSession::of_task(1 << 63, TaskId(6), 0).expect("a range");
        let last = CallerSession::of_task(1 << 63, TaskId((1 << 37) - 1), 63).expect("a range");
        // Above every index the caller's own client counts (from 0), and apart from each
        // other: no two attempts of a session share an id.
        let mut ranges = [a, retried, next, last];
        ranges.sort_by_key(|r| r.first);
        assert!(ranges[0].first >= 1 << 63);
        for pair in ranges.windows(2) {
            assert!(pair[0].first + pair[0].count <= pair[1].first, "{pair:?}");
        }
        assert_eq!(last.first + (last.count - 1), u64::MAX);
        assert_eq!(CallerSession::of_task(0, TaskId(5), 0), None);
        assert_eq!(CallerSession::of_task(1 << 63, TaskId(1 << 37), 0), None);
        assert_eq!(CallerSession::of_task(1 << 63, TaskId(5), 64), None);
    }
}
