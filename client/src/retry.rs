//! [`Retry`]: the rules by which one call follows the head group's leader, with the time passed
//! in: after each failed attempt, whether to follow the leader a replica named, try the next
//! replica after a pause, or give up (with the attempt's own error, or
//! [`ClientError::Unavailable`] when no leader answered in time); and whether a write's outcome
//! is now unknown, with the [`ClientError::UnknownOutcome`] that says why.
//!
//! It reads no clock, sleeps not and does no I/O: the client's call loop (`client.rs`) maps each
//! tonic status to an [`Answered`], passes the time since the call began and does what the
//! [`Step`] says (follow, rotate and sleep, return an error); the deterministic simulation
//! (`escher-sim`) maps its simulated answers the same way and passes its simulated time, so both
//! run these rules and a bug in them is found seed by seed. It is the client's counterpart of
//! the worker's `escher_worker::protocol::Protocol`. A call that succeeded ends with its reply:
//! the rules are about the attempts that failed.
//!
//! The rules:
//!
//! - a replica that names the leader is followed at once, at most [`MAX_REDIRECTS`] times in a
//!   row (replicas that disagree mid-election must not make a tight loop); after that, and when
//!   a replica knows no leader, the next replica is tried after a pause;
//! - a replica that is down or whose connection broke ([`Answered::Unreachable`]), or that
//!   refused the call because it is stopping ([`Answered::GoingAway`]), is left for the next
//!   replica after a pause when more than one is known; with one, its failure is the caller's
//!   error at once;
//! - the pauses of one call double from [`PAUSE_MIN`] to [`PAUSE_MAX`] ([`pause`]: backon's
//!   `ExponentialBuilder` without jitter, which the client used before, gives the same ones to
//!   the microsecond), without jitter, so a simulated seed replays to the same event;
//! - once the failover timeout has passed, a call still looking for a leader gives up with
//!   [`ClientError::Unavailable`], listing each replica's last answer and when it came;
//! - any other failure ([`Answered::Failed`]: the replica's own answer, a deadline) ends the call
//!   with that error;
//! - a replica that had proposed the write and stopped leading before it committed
//!   ([`Answered::MayStillCommit`]: raft may still commit the entry under the next leader) is
//!   followed as a "not leader" is, and leaves the write's outcome open;
//! - a write's outcome is unknown once an attempt may have reached a replica whose answer never
//!   came ([`Answered::Unreachable`] or [`Answered::Failed`] with `sent`; or a stream that
//!   broke before the call, [`Retry::already_sent`]), or was proposed by a replica that could
//!   not answer for it ([`Answered::MayStillCommit`]): then any failure but a refusal is
//!   [`ClientError::UnknownOutcome`] ([`Retry::outcome`]), whose cause first names the attempt
//!   that left the outcome open, then what the call ended with, so that it never reads as a
//!   plain "no leader".

use std::collections::BTreeMap;
use std::fmt::Display;
use std::time::Duration;

use escher_proto::types::{RequestKey, key_text};

use crate::ClientError;

/// What a failed call's tonic status tells the rules: the client's own mapping, for the other
/// callers of the head group that follow its leader by these rules (the worker's calls on a
/// task's behalf: `escher_worker`'s `TaskContext`).
#[cfg(feature = "grpc")]
pub fn answered(status: &tonic::Status) -> Answered<String> {
    crate::client::answered(status)
}

/// The first pause between attempts.
pub const PAUSE_MIN: Duration = Duration::from_millis(20);
/// The longest pause between attempts.
pub const PAUSE_MAX: Duration = Duration::from_millis(500);
/// How many named leaders a call follows in a row before it pauses like for an election.
pub const MAX_REDIRECTS: u32 = 8;

/// The pause before the call's `n`th retry after a pause (counted from 0): [`PAUSE_MIN`],
/// doubled each time, at most [`PAUSE_MAX`].
pub fn pause(n: u32) -> Duration {
    PAUSE_MIN
        .saturating_mul(2u32.saturating_pow(n))
        .min(PAUSE_MAX)
}

/// What one failed attempt of a call answered. `R` names a replica (the client: its URL, without
/// a trailing `/`; the simulation: its number).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Answered<R> {
    /// The replica does not lead and named the leader.
    Leader(R),
    /// The replica does not lead and knows no leader (an election, or no majority).
    NoLeader,
    /// The replica had proposed the write to the group and stopped leading (or stalled, or
    /// began to stop) before its entry committed: the write may still commit under the next
    /// leader, or never. Followed like [`Answered::Leader`] (or [`Answered::NoLeader`] without
    /// a leader), and it leaves the outcome open.
    MayStillCommit {
        /// The leader it named, if it knew one.
        leader: Option<R>,
    },
    /// The replica is stopping gracefully and refused the call without processing it.
    GoingAway,
    /// The replica is down, or the connection broke mid-call.
    Unreachable {
        /// The request may have reached the replica (false: the connection was refused, so it
        /// never went out).
        sent: bool,
        /// What the caller saw, in a few words.
        what: String,
    },
    /// Anything else: the replica's own answer (a refusal, a full disk, ...) or a failure that
    /// is not retried (a deadline). It ends the call.
    Failed {
        /// The request may have been applied (the call failed after it went out, without an
        /// answer from the replica).
        sent: bool,
    },
}

/// What the caller does next ([`Retry::step`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Step<R> {
    /// Call the named leader now (and believe it leads).
    Follow(R),
    /// Call the next replica after this pause.
    Next(Duration),
    /// End the call with the attempt's own error (the caller builds it from what it got).
    Fail,
    /// End the call with this error: no leader answered within the failover timeout.
    Unavailable {
        /// What [`ClientError::Unavailable`]'s message says.
        message: String,
    },
}

/// What one replica answered last.
#[derive(Debug, Clone)]
struct Seen<R> {
    /// How long after the call began.
    after: Duration,
    /// The answer, in words.
    what: String,
    /// The leader it named, if it named one.
    names: Option<R>,
    /// It knew no leader.
    no_leader: bool,
}

/// Why a write's outcome is unknown.
#[derive(Debug, Clone)]
struct Open {
    /// What the client saw, in words.
    why: String,
    /// The attempt (counted from 1) that left it open; 0: before this call.
    attempt: u32,
}

/// The retry rules of one call. See the [module documentation](self).
#[derive(Debug, Clone)]
pub struct Retry<R> {
    /// The replicas, as an error names them (the client's head URLs).
    heads: String,
    /// How long the call looks for a leader.
    failover: Duration,
    /// When the call began.
    started: Duration,
    /// Named leaders followed in a row.
    redirects: u32,
    /// Pauses so far.
    pauses: u32,
    /// Attempts that failed so far.
    attempts: u32,
    /// What each replica answered last.
    seen: BTreeMap<R, Seen<R>>,
    /// Why the outcome is unknown, once it is.
    open: Option<Open>,
}

impl<R: Clone + Ord + Display> Retry<R> {
    /// The rules of a call to the replicas `heads` (as errors name them) that begins at `now`
    /// and looks for a leader for at most `failover`.
    pub fn new(heads: impl Into<String>, failover: Duration, now: Duration) -> Retry<R> {
        Retry {
            heads: heads.into(),
            failover,
            started: now,
            redirects: 0,
            pauses: 0,
            attempts: 0,
            seen: BTreeMap::new(),
            open: None,
        }
    }

    /// The same call, for a write that already went out before it (on a stream that broke
    /// before its answer): its outcome is unknown from the start.
    pub fn already_sent(mut self) -> Retry<R> {
        self.open = Some(Open {
            why: "it went out on a stream that broke before its answer".to_string(),
            attempt: 0,
        });
        self
    }

    /// Whether an attempt may have been applied without its answer reaching the caller.
    pub fn maybe_applied(&self) -> bool {
        self.open.is_some()
    }

    /// Replica `replica` answered `answered` at `now`, with `known` replicas known: what to do.
    pub fn step(
        &mut self,
        replica: R,
        answered: Answered<R>,
        now: Duration,
        known: usize,
    ) -> Step<R> {
        self.attempts += 1;
        let after = now.saturating_sub(self.started);
        let expired = after >= self.failover;
        if self.open.is_none() {
            let broke = match &answered {
                Answered::Unreachable { sent: true, what } => {
                    Some(format!("the call broke before its answer ({what})"))
                }
                Answered::Failed { sent: true } => Some("the call failed before its answer".into()),
                Answered::MayStillCommit { .. } => Some(
                    "the replica had proposed it to the group and stopped leading before it \
                     committed (it may still commit under the next leader)"
                        .into(),
                ),
                _ => None,
            };
            if let Some(broke) = broke {
                self.open = Some(Open {
                    why: format!(
                        "the request went out to {replica} {:.1}s in and {broke}",
                        after.as_secs_f64()
                    ),
                    attempt: self.attempts,
                });
            }
        }
        let what = summary(&answered);
        // Past the open outcome, an answer that it may still commit is one of "not leader".
        let answered = match answered {
            Answered::MayStillCommit { leader: Some(l) } => Answered::Leader(l),
            Answered::MayStillCommit { leader: None } => Answered::NoLeader,
            other => other,
        };
        self.seen.insert(
            replica,
            Seen {
                after,
                what,
                names: match &answered {
                    Answered::Leader(leader) => Some(leader.clone()),
                    _ => None,
                },
                no_leader: answered == Answered::NoLeader,
            },
        );
        match answered {
            Answered::Leader(leader) if !expired && self.redirects < MAX_REDIRECTS => {
                self.redirects += 1;
                return Step::Follow(leader);
            }
            Answered::Leader(_) | Answered::NoLeader if !expired => {}
            Answered::GoingAway | Answered::Unreachable { .. } if !expired && known > 1 => {}
            Answered::Failed { .. } => return Step::Fail,
            answered => {
                let leaderless = matches!(answered, Answered::Leader(_) | Answered::NoLeader);
                if expired && (leaderless || known > 1) {
                    return Step::Unavailable {
                        message: self.no_leader_message(),
                    };
                }
                return Step::Fail;
            }
        }
        self.redirects = 0;
        let wait = pause(self.pauses);
        self.pauses = self.pauses.saturating_add(1);
        Step::Next(wait)
    }

    /// The error for [`Step::Unavailable`].
    pub fn unavailable(&self, message: String) -> ClientError {
        ClientError::Unavailable {
            url: self.heads.clone(),
            message,
        }
    }

    /// The error a write under `key` gets when its call ended with `error`: `error` itself,
    /// unless an attempt may have been applied and `error` is not a refusal; then
    /// [`ClientError::UnknownOutcome`], whose cause names the attempt that left it open and then
    /// `error`.
    pub fn outcome(
        &self,
        call: &'static str,
        key: Option<RequestKey>,
        error: ClientError,
    ) -> ClientError {
        let Some(open) = &self.open else {
            return error;
        };
        if error.is_refusal() {
            return error;
        }
        let cause = if open.attempt == self.attempts && open.attempt > 0 {
            // The attempt that left it open is the one the call ended with.
            format!("{}: {error}", open.why)
        } else {
            format!("{}; after that: {error}", open.why)
        };
        ClientError::UnknownOutcome {
            call,
            key: key.map_or_else(|| "(none)".to_string(), key_text),
            cause,
        }
    }

    /// Why no leader answered: what each replica answered last, and when.
    fn no_leader_message(&self) -> String {
        let answers: Vec<String> = self
            .seen
            .iter()
            .map(|(replica, s)| format!("{replica} {:.1}s in: {}", s.after.as_secs_f64(), s.what))
            .collect();
        let hint = if self.seen.values().any(|s| s.no_leader) {
            " (fewer than a majority of the replicas can reach each other: start or reconnect the \
             ones that are down)"
        } else if self.name_each_other() {
            " (each replica's last answer, at a different moment: replicas that name each other \
             answered while an election had not settled; start or reconnect the replicas that are \
             down, or try again)"
        } else {
            ""
        };
        format!(
            "no head replica answered as the leader within {:?}{hint}; {}",
            self.failover,
            answers.join("; ")
        )
    }

    /// Whether two replicas named each other as the leader (each at its own moment).
    fn name_each_other(&self) -> bool {
        self.seen.iter().any(|(replica, s)| {
            s.names.as_ref().is_some_and(|leader| {
                self.seen
                    .get(leader)
                    .is_some_and(|back| back.names.as_ref() == Some(replica))
            })
        })
    }
}

/// What a failed answer says, in a few words, for an error that lists them.
fn summary<R: Display>(answered: &Answered<R>) -> String {
    match answered {
        Answered::Leader(leader) => format!("up, not the leader (it names {leader})"),
        Answered::NoLeader => "up, no leader known (an election, or no majority)".to_string(),
        Answered::MayStillCommit { leader } => format!(
            "up, stopped leading before the write committed (it may still commit){}",
            leader
                .as_ref()
                .map(|l| format!("; it names {l}"))
                .unwrap_or_default()
        ),
        Answered::GoingAway => "stopping (it refused the call unprocessed)".to_string(),
        Answered::Unreachable { sent: false, .. } => {
            "down (the connection was refused)".to_string()
        }
        Answered::Unreachable { what, .. } => what.clone(),
        Answered::Failed { .. } => "failed".to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const FAILOVER: Duration = Duration::from_secs(15);

    fn ms(n: u64) -> Duration {
        Duration::from_millis(n)
    }

    fn retry() -> Retry<String> {
        Retry::new("http://a,http://b", FAILOVER, ms(1_000))
    }

    fn cut() -> Answered<String> {
        Answered::Unreachable {
            sent: true,
            what: "Unknown: connection reset".into(),
        }
    }

    #[test]
    fn a_named_leader_is_followed_at_once_and_after_eight_hops_the_call_pauses() {
        let mut r = retry();
        for _ in 0..MAX_REDIRECTS {
            let step = r.step(
                "http://a".into(),
                Answered::Leader("http://b".into()),
                ms(1_000),
                2,
            );
            assert_eq!(step, Step::Follow("http://b".to_string()));
        }
        let step = r.step(
            "http://a".into(),
            Answered::Leader("http://b".into()),
            ms(1_000),
            2,
        );
        assert_eq!(step, Step::Next(PAUSE_MIN));
        // The count of hops starts again after a pause.
        let step = r.step(
            "http://a".into(),
            Answered::Leader("http://b".into()),
            ms(1_100),
            2,
        );
        assert_eq!(step, Step::Follow("http://b".to_string()));
        assert!(!r.maybe_applied());
    }

    #[test]
    fn no_leader_pauses_doubling_then_gives_up_with_every_replicas_answer() {
        let mut r = retry();
        let mut pauses = Vec::new();
        for i in 0..8 {
            match r.step("http://a".into(), Answered::NoLeader, ms(1_000 + i), 1) {
                Step::Next(p) => pauses.push(p.as_millis()),
                other => panic!("{other:?}"),
            }
        }
        assert_eq!(pauses, [20, 40, 80, 160, 320, 500, 500, 500]);
        // With one replica too: "no leader" is always worth waiting for.
        let Step::Unavailable { message } =
            r.step("http://a".into(), Answered::NoLeader, ms(16_000), 1)
        else {
            panic!("not unavailable")
        };
        assert!(
            message.starts_with("no head replica answered as the leader within 15s"),
            "{message}"
        );
        assert!(message.contains("fewer than a majority"), "{message}");
        assert!(
            message.contains("http://a 15.0s in: up, no leader known"),
            "{message}"
        );
        let ClientError::Unavailable { url, .. } = r.unavailable(message) else {
            panic!("not unavailable")
        };
        assert_eq!(url, "http://a,http://b");
    }

    #[cfg(feature = "grpc")]
    #[test]
    fn the_pauses_are_backons_exponential_ones() {
        use backon::{BackoffBuilder, ExponentialBuilder};
        let backon: Vec<Duration> = ExponentialBuilder::default()
            .with_min_delay(PAUSE_MIN)
            .with_max_delay(PAUSE_MAX)
            .without_max_times()
            .build()
            .take(40)
            .collect();
        // The same to the microsecond (backon multiplies in f32: 39.999999 ms for 40 ms).
        let ours: Vec<Duration> = (0..40).map(pause).collect();
        assert_eq!(ours.len(), backon.len());
        for (n, (a, b)) in ours.iter().zip(&backon).enumerate() {
            assert!(
                a.abs_diff(*b) < Duration::from_micros(1),
                "pause {n}: {a:?} and {b:?}"
            );
        }
        assert_eq!(pause(u32::MAX), PAUSE_MAX);
    }

    #[test]
    fn an_unreachable_or_stopping_replica_is_left_only_when_there_is_another() {
        for answered in [cut(), Answered::GoingAway] {
            let mut r = retry();
            assert_eq!(
                r.step("http://a".into(), answered.clone(), ms(1_000), 2),
                Step::Next(PAUSE_MIN)
            );
            let mut alone = retry();
            assert_eq!(
                alone.step("http://a".into(), answered, ms(1_000), 1),
                Step::Fail
            );
        }
        // Cut after it went out: the outcome is open; refused before it went out, or stopping
        // (which processes nothing): it is not.
        let mut r = retry();
        r.step("http://a".into(), cut(), ms(1_000), 2);
        assert!(r.maybe_applied());
        let mut r = retry();
        let refused = Answered::Unreachable {
            sent: false,
            what: "refused".into(),
        };
        r.step("http://a".into(), refused, ms(1_000), 2);
        r.step("http://b".into(), Answered::GoingAway, ms(1_000), 2);
        assert!(!r.maybe_applied());
    }

    #[test]
    fn a_replicas_own_answer_ends_the_call() {
        let mut r = retry();
        assert_eq!(
            r.step(
                "http://a".into(),
                Answered::Failed { sent: false },
                ms(1_000),
                3
            ),
            Step::Fail
        );
        assert!(!r.maybe_applied());
        // A deadline after the request went out: the call ends, and the outcome is open.
        let mut r = retry();
        assert_eq!(
            r.step(
                "http://a".into(),
                Answered::Failed { sent: true },
                ms(1_000),
                3
            ),
            Step::Fail
        );
        assert!(r.maybe_applied());
        let err = r.outcome("submit", None, ClientError::Usage("x".into()));
        assert!(
            matches!(err, ClientError::Usage(_)),
            "a refusal stays one: {err}"
        );
    }

    #[test]
    fn past_the_failover_timeout_a_cut_ends_the_call_as_unavailable() {
        let mut r = retry();
        let step = r.step("http://a".into(), cut(), ms(17_000), 2);
        let Step::Unavailable { message } = step else {
            panic!("{step:?}")
        };
        assert!(
            message.contains("http://a 16.0s in: Unknown: connection reset"),
            "{message}"
        );
        // With one replica a cut is the caller's own error, expired or not.
        let mut r = retry();
        assert_eq!(r.step("http://a".into(), cut(), ms(17_000), 1), Step::Fail);
    }

    #[test]
    fn replicas_that_name_each_other_are_explained() {
        let mut r = retry();
        r.step(
            "http://a".into(),
            Answered::Leader("http://b".into()),
            ms(1_000),
            2,
        );
        let Step::Unavailable { message } = r.step(
            "http://b".into(),
            Answered::Leader("http://a".into()),
            ms(17_000),
            2,
        ) else {
            panic!("not unavailable")
        };
        assert!(message.contains("an election had not settled"), "{message}");
        assert!(
            message.contains("http://a 0.0s in: up, not the leader (it names http://b)"),
            "{message}"
        );
    }

    #[test]
    fn an_unknown_outcome_names_the_attempt_that_left_it_open_then_what_ended_the_call() {
        let key = RequestKey {
            client: 0xab,
            seq: 7,
            first_incomplete: 7,
        };
        // Cut after it went out to a, then a and b name each other until the time is up.
        let mut r = retry();
        r.step("http://a".into(), cut(), ms(1_200), 2);
        r.step(
            "http://b".into(),
            Answered::Leader("http://a".into()),
            ms(2_000),
            2,
        );
        r.step(
            "http://a".into(),
            Answered::Leader("http://b".into()),
            ms(2_000),
            2,
        );
        let Step::Unavailable { message } = r.step(
            "http://b".into(),
            Answered::Leader("http://a".into()),
            ms(16_500),
            2,
        ) else {
            panic!("not unavailable")
        };
        let err = r.outcome("submit", Some(key), r.unavailable(message));
        let ClientError::UnknownOutcome { key, cause, .. } = &err else {
            panic!("{err:?}")
        };
        assert_eq!(key, "ab-7");
        assert!(
            cause.starts_with(
                "the request went out to http://a 0.2s in and the call broke before its answer \
                 (Unknown: connection reset); after that: "
            ),
            "{cause}"
        );
        assert!(
            cause.contains("no head replica answered as the leader"),
            "{cause}"
        );
        // The attempt that left it open ended the call: said once, with the error.
        let mut r = retry();
        assert_eq!(r.step("http://a".into(), cut(), ms(1_000), 1), Step::Fail);
        let err = r.outcome("submit", Some(key_of(1)), ClientError::Usage("x".into()));
        assert!(matches!(err, ClientError::Usage(_)));
        let cause = r.outcome(
            "submit",
            Some(key_of(1)),
            ClientError::Unavailable {
                url: "http://a".into(),
                message: "connection reset".into(),
            },
        );
        let text = cause.to_string();
        assert!(
            text.contains("the request went out to http://a 0.0s in and the call broke before its answer (Unknown: connection reset): "),
            "{text}"
        );
        assert!(!text.contains("after that"), "{text}");
        // Sent on a stream before the call: open from the start.
        let r: Retry<String> = retry().already_sent();
        assert!(r.maybe_applied());
        let text = r
            .outcome(
                "submit",
                None,
                ClientError::Unavailable {
                    url: "http://a".into(),
                    message: "down".into(),
                },
            )
            .to_string();
        assert!(
            text.contains("it went out on a stream that broke before its answer; after that:"),
            "{text}"
        );
        assert!(text.contains("--key (none)"), "{text}");
        // Nothing sent: the error as it is.
        let r = retry();
        let err = r.outcome("submit", None, ClientError::Usage("x".into()));
        assert!(matches!(err, ClientError::Usage(_)));
    }

    #[test]
    fn a_write_that_may_still_commit_is_followed_and_its_outcome_stays_open_to_the_end() {
        // a proposed it and lost the lead, naming b: b is called at once.
        let mut r = retry();
        let step = r.step(
            "http://a".into(),
            Answered::MayStillCommit {
                leader: Some("http://b".into()),
            },
            ms(1_200),
            2,
        );
        assert_eq!(step, Step::Follow("http://b".to_string()));
        assert!(r.maybe_applied());
        // Without a leader to name: the next replica after a pause.
        let mut alone = retry();
        let step = alone.step(
            "http://a".into(),
            Answered::MayStillCommit { leader: None },
            ms(1_000),
            2,
        );
        assert_eq!(step, Step::Next(PAUSE_MIN));
        assert!(alone.maybe_applied());
        // b knows no leader until the time is up: the call gives up, and says the write's
        // outcome is unknown, naming the replica that proposed it.
        let Step::Unavailable { message } =
            r.step("http://b".into(), Answered::NoLeader, ms(16_500), 2)
        else {
            panic!("not unavailable")
        };
        assert!(
            message.contains("http://a 0.2s in: up, stopped leading before the write committed"),
            "{message}"
        );
        let err = r.outcome("submit", Some(key_of(3)), r.unavailable(message));
        let ClientError::UnknownOutcome { key, cause, .. } = &err else {
            panic!("{err:?}")
        };
        assert_eq!(key, "1-3");
        assert!(
            cause.starts_with(
                "the request went out to http://a 0.2s in and the replica had proposed it to the \
                 group and stopped leading before it committed (it may still commit under the \
                 next leader); after that: "
            ),
            "{cause}"
        );
        assert!(
            cause.contains("no head replica answered as the leader"),
            "{cause}"
        );
        // A replica's own answer after it (a full disk): still unknown, not a plain failure.
        let mut r = retry();
        r.step(
            "http://a".into(),
            Answered::MayStillCommit { leader: None },
            ms(1_000),
            2,
        );
        let step = r.step(
            "http://b".into(),
            Answered::Failed { sent: false },
            ms(1_100),
            2,
        );
        assert_eq!(step, Step::Fail);
        let full = ClientError::Unavailable {
            url: "http://b".into(),
            message: "refuses writes: the disk is full".into(),
        };
        let err = r.outcome("submit", Some(key_of(4)), full);
        assert!(matches!(err, ClientError::UnknownOutcome { .. }), "{err}");
    }

    fn key_of(seq: u64) -> RequestKey {
        RequestKey {
            client: 1,
            seq,
            first_incomplete: seq,
        }
    }
}
