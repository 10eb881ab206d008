//! [`ClientError`]: everything that can go wrong between an application and the head.
//!
//! The variants separate three sources: the client refused to send something (a malformed
//! name, a misused builder, `NodeSpec::Local` outside a task), the head answered with an error
//! status (its message kept verbatim, because the head says what was wrong), and the task
//! itself failed, did not finish in time, or finished so long ago that the head's retention
//! dropped its record ([`ClientError::Evicted`], never "unknown task"). [`ClientError::is_retryable`] says which ones can
//! succeed if simply tried again.

#[cfg(feature = "grpc")]
use std::error::Error as StdError;
use std::time::Duration;

use escher_proto::codec::CodecError;
use escher_proto::types::{Evicted, MigRefusal};
#[cfg(feature = "grpc")]
use escher_proto::{ConvertError, types::MIG_REFUSAL_METADATA};
use escher_proto::{TaskId, TaskState, TypeError};
use thiserror::Error;
#[cfg(feature = "grpc")]
use tonic::Code;

/// The hint shown whenever the head cannot be reached.
pub(crate) const CONNECT_HINT: &str = "is escher-head running? set --head or ESCHER_HEAD";

/// An error from the escher client.
#[derive(Debug, Error)]
#[non_exhaustive]
pub enum ClientError {
    /// The head could not be reached when connecting.
    #[error("cannot connect to the escher head at {url}: {cause} ({CONNECT_HINT})")]
    Connect {
        /// The head URL that was tried.
        url: String,
        /// The cause, with its whole chain (`transport error: tcp connect error: ...`).
        cause: String,
    },
    /// The connection to the head was lost or refused during a call.
    #[error("the escher head at {url} is unavailable: {message} ({CONNECT_HINT})")]
    Unavailable {
        /// The head URL.
        url: String,
        /// What the transport said.
        message: String,
    },
    /// The head rejected the request as malformed or not allowed; its message verbatim.
    #[error("{0}")]
    InvalidArgument(String),
    /// The head does not know the task (or node) named in the request; its message verbatim.
    #[error("{0}")]
    NotFound(String),
    /// A watch asked to resume after a revision older than the head keeps: list the state
    /// again, then watch from now. The head's message verbatim.
    #[error("{0}")]
    HistoryExpired(String),
    /// The task finished and the head's retention has since dropped its record (its result,
    /// reason and logs): the tombstone says how and when it ended, while the head keeps it.
    #[error(transparent)]
    Evicted(Evicted),
    /// A name, amount or other value given to the client was malformed (nothing was sent).
    #[error(transparent)]
    Invalid(#[from] TypeError),
    /// The API was used in a way that cannot work (nothing was sent): the text says how to fix
    /// it.
    #[error("{0}")]
    Usage(String),
    /// A request is larger than a message to the head may be (nothing was sent).
    #[error(
        "the {call} request is {size} bytes, more than the {limit} bytes a message to the head \
         may carry; pass large data by reference (a path or URL) instead of in function \
         arguments, or split the batch"
    )]
    MessageTooLarge {
        /// Which call (`submit`, `set_resources`).
        call: &'static str,
        /// The encoded size of the request.
        size: usize,
        /// The largest message the client sends.
        limit: usize,
    },
    /// A task did not finish within the time the caller allowed. It may still finish later.
    #[error("task {id} did not finish within {after:?}")]
    Timeout {
        /// The task waited for.
        id: TaskId,
        /// How long the caller waited.
        after: Duration,
    },
    /// A reservation was not placed within the time the caller allowed. The head may still
    /// place it later (unless it was reserved with a timeout of its own).
    #[error(
        "reservation {name} was not placed within {after:?}: {pending} of its {bundles} bundles \
         are still pending; wait longer, free resources, or release it (escher cancel)"
    )]
    ReservationTimeout {
        /// The reservation's name.
        name: String,
        /// How many bundles were still waiting.
        pending: usize,
        /// How many bundles it has.
        bundles: usize,
        /// How long the caller waited.
        after: Duration,
    },
    /// A MIG reconfiguration was still under way when the time the caller allowed ran out. It
    /// goes on; `escher gpus` shows it.
    #[error(
        "GPU {gpu} of node {node} is still being reconfigured to {target} after {after:?} (it \
         waits for its busy slices to drain, then takes seconds per slice)"
    )]
    MigTimeout {
        /// The node.
        node: escher_proto::NodeId,
        /// The GPU index.
        gpu: u32,
        /// The layout being applied.
        target: String,
        /// How long the caller waited.
        after: Duration,
    },
    /// A write may or may not have been applied: a request reached (or may have reached) a
    /// head replica, and then the connection broke, the replica stopped answering, or no
    /// leader answered within the failover timeout. Retrying under the same idempotency key
    /// applies it at most once (`escher submit --key KEY`, within the ten minutes a head
    /// remembers a client's writes).
    #[error(
        "the {call} may or may not have been applied: {cause}; {}",
        retry_hint(call, key)
    )]
    UnknownOutcome {
        /// Which call (`submit`).
        call: &'static str,
        /// The write's idempotency key, as `--key` takes it (`CLIENT-SEQ`, hexadecimal client
        /// id).
        key: String,
        /// The last failure.
        cause: String,
    },
    /// The head refused a MIG change; `refusal` says why for a program that acts on it, the
    /// message (the head's, verbatim) says the rest and what to do.
    #[error("{message}")]
    MigRefused {
        /// Why.
        refusal: MigRefusal,
        /// The head's message.
        message: String,
    },
    /// A MIG reconfiguration failed on the worker; its reason verbatim.
    #[error("the MIG reconfiguration of GPU {gpu} on node {node} failed: {reason}")]
    MigFailed {
        /// The node.
        node: escher_proto::NodeId,
        /// The GPU index.
        gpu: u32,
        /// Why, as the worker said.
        reason: String,
    },
    /// A task ended without succeeding (failed or cancelled), so it has no result.
    #[error("task {id} {state}: {reason}")]
    TaskFailed {
        /// The task.
        id: TaskId,
        /// How it ended: `failed` or `cancelled`.
        state: TaskState,
        /// Why, as the head reported it.
        reason: String,
    },
    /// An actor's incarnation ended before it answered a call (and the call was not, or could
    /// no longer be, sent to a later incarnation), or the actor has ended: why.
    #[error("actor {actor} died: {reason}")]
    ActorDied {
        /// The actor.
        actor: TaskId,
        /// Why, as the worker or the head said (`the actor was killed`, `method X.y
        /// panicked: ...`, `node 3 lost`).
        reason: String,
    },
    /// An actor's method failed (the actor lives on): what it said.
    #[error("actor {actor}: {method} failed: {message}")]
    ActorCall {
        /// The actor.
        actor: TaskId,
        /// The method.
        method: String,
        /// Why, as the method said.
        message: String,
    },
    /// An actor call was cancelled ([`crate::CallCanceller::cancel`]): removed before it
    /// started, or stopped while it ran (an async Python actor's coroutine).
    #[error("actor {actor}: {method} was cancelled: {reason}")]
    ActorCallCancelled {
        /// The actor.
        actor: TaskId,
        /// The method.
        method: String,
        /// Why, as the worker said.
        reason: String,
    },
    /// A task succeeded but its result is not of the kind asked for (for example a typed value
    /// was asked of a command task, which only has an exit code).
    #[error("task {id} ended with {found}, not a function's return value")]
    WrongResultKind {
        /// The task.
        id: TaskId,
        /// What it ended with (`exit code 0`, `a released ghost`).
        found: String,
    },
    /// A function task's result (or arguments) could not be decoded (or encoded).
    #[error("cannot decode the result of task {id}: {source}")]
    Decode {
        /// The task whose result was read.
        id: TaskId,
        /// What went wrong.
        #[source]
        source: CodecError,
    },
    /// The head sent a reply the client cannot read (a version mismatch or a head bug).
    #[cfg(feature = "grpc")]
    #[error("the head sent a malformed reply: {0}")]
    Protocol(#[from] ConvertError),
    /// The head did not accept the call's token (none, unknown, revoked); the message says
    /// what was wrong and where tokens come from, and `source` where this client found its.
    #[error("the head refused the token ({from}): {message}")]
    Unauthenticated {
        /// What the head said.
        message: String,
        /// Where the client's token came from (or where it looked for one).
        from: String,
    },
    /// The token's role may not do this (or not in this namespace); the head's message.
    #[error("permission denied: {0}")]
    PermissionDenied(String),
    /// An object could not be read (no holder gave its bytes whole) or a put's copy was not
    /// recorded by the head: the message names the object and each holder's answer.
    #[error("{0}")]
    ObjectUnavailable(String),
    /// Every copy of object `id` was on nodes that are gone, and nothing rebuilds it: the
    /// message (the head's) names the object, `node` (its last copy's) and why that node went.
    #[error("{message}")]
    ObjectLost {
        /// The object.
        id: escher_proto::types::ObjectId,
        /// The node that held its last copy.
        node: escher_proto::types::NodeId,
        /// What the head said, why included.
        message: String,
    },
    /// An object's bytes did not move between this client and a worker's data plane.
    #[cfg(feature = "grpc")]
    #[error(transparent)]
    Object(#[from] crate::objects::ObjectTransferError),
    /// Any other error status from the head.
    #[cfg(feature = "grpc")]
    #[error("the head answered {code:?}: {message}", code = .0.code(), message = .0.message())]
    Rpc(tonic::Status),
}

impl ClientError {
    /// Whether the same call may succeed if tried again unchanged: the head was unreachable or
    /// overloaded, or a task had not finished yet. Every other error is fatal for that call.
    pub fn is_retryable(&self) -> bool {
        match self {
            ClientError::Connect { .. }
            | ClientError::Unavailable { .. }
            | ClientError::Timeout { .. }
            | ClientError::ReservationTimeout { .. }
            | ClientError::MigTimeout { .. } => true,
            ClientError::MigRefused { refusal, .. } => refusal.passes(),
            #[cfg(feature = "grpc")]
            ClientError::Object(e) => e.is_retryable(),
            #[cfg(feature = "grpc")]
            ClientError::Rpc(status) => matches!(
                status.code(),
                Code::Unavailable
                    | Code::ResourceExhausted
                    | Code::Aborted
                    | Code::DeadlineExceeded
            ),
            ClientError::InvalidArgument(_)
            | ClientError::NotFound(_)
            | ClientError::HistoryExpired(_)
            | ClientError::Evicted(_)
            | ClientError::Invalid(_)
            | ClientError::Usage(_)
            | ClientError::MessageTooLarge { .. }
            | ClientError::TaskFailed { .. }
            | ClientError::ActorDied { .. }
            | ClientError::ActorCall { .. }
            | ClientError::ActorCallCancelled { .. }
            | ClientError::WrongResultKind { .. }
            | ClientError::Decode { .. }
            | ClientError::MigFailed { .. }
            | ClientError::Unauthenticated { .. }
            | ClientError::PermissionDenied(_)
            | ClientError::ObjectUnavailable(_)
            | ClientError::ObjectLost { .. } => false,
            #[cfg(feature = "grpc")]
            ClientError::Protocol(_) => false,
            // Not unchanged: a new call carries a new key. Retry under the key it names.
            ClientError::UnknownOutcome { .. } => false,
        }
    }

    /// Why the head refused a MIG change, when this is such a refusal.
    pub fn mig_refusal(&self) -> Option<MigRefusal> {
        match self {
            ClientError::MigRefused { refusal, .. } => Some(*refusal),
            _ => None,
        }
    }

    /// Whether the head (or the client, before sending) refused the request as it is: nothing
    /// was applied, and sending it again unchanged gets the same answer. A failure that is not
    /// a refusal (the head unreachable, the reply lost, any other status) leaves the outcome
    /// unknown.
    pub fn is_refusal(&self) -> bool {
        match self {
            ClientError::InvalidArgument(_)
            | ClientError::NotFound(_)
            | ClientError::Invalid(_)
            | ClientError::Usage(_)
            | ClientError::MessageTooLarge { .. }
            | ClientError::Unauthenticated { .. }
            | ClientError::PermissionDenied(_)
            | ClientError::MigRefused { .. }
            | ClientError::ObjectLost { .. } => true,
            #[cfg(feature = "grpc")]
            ClientError::Rpc(status) => status.code() == Code::AlreadyExists,
            _ => false,
        }
    }
}

/// What only the network client makes of errors: statuses from the head, connection failures,
/// one coalesced call's failure shared by its callers.
#[cfg(feature = "grpc")]
impl ClientError {
    /// Whether a call of several writes failed as a whole with nothing applied, so that each
    /// write may be sent again alone and fail or succeed on its own: a refusal, or a quota
    /// (RESOURCE_EXHAUSTED) that the writes together exceed.
    pub(crate) fn refused_as_a_whole(&self) -> bool {
        self.is_refusal()
            || matches!(self, ClientError::Rpc(status) if status.code() == Code::ResourceExhausted)
    }

    /// This error, saying where the client's token came from if the head refused it.
    pub(crate) fn with_credentials(self, credentials: &crate::Credentials) -> ClientError {
        match self {
            ClientError::Unauthenticated { message, .. } => ClientError::Unauthenticated {
                message,
                from: credentials.source().to_string(),
            },
            other => other,
        }
    }

    /// The same error again, for a second caller that shares its cause (one coalesced call
    /// failing for every submit in it).
    pub(crate) fn again(&self) -> ClientError {
        match self {
            ClientError::Connect { url, cause } => ClientError::Connect {
                url: url.clone(),
                cause: cause.clone(),
            },
            ClientError::Unavailable { url, message } => ClientError::Unavailable {
                url: url.clone(),
                message: message.clone(),
            },
            ClientError::InvalidArgument(m) => ClientError::InvalidArgument(m.clone()),
            ClientError::NotFound(m) => ClientError::NotFound(m.clone()),
            ClientError::HistoryExpired(m) => ClientError::HistoryExpired(m.clone()),
            ClientError::Invalid(e) => ClientError::Invalid(e.clone()),
            ClientError::MessageTooLarge { call, size, limit } => ClientError::MessageTooLarge {
                call,
                size: *size,
                limit: *limit,
            },
            ClientError::Protocol(e) => ClientError::Protocol(e.clone()),
            ClientError::Rpc(status) => ClientError::Rpc(status.clone()),
            ClientError::Unauthenticated { message, from } => ClientError::Unauthenticated {
                message: message.clone(),
                from: from.clone(),
            },
            ClientError::PermissionDenied(m) => ClientError::PermissionDenied(m.clone()),
            ClientError::ObjectUnavailable(m) => ClientError::ObjectUnavailable(m.clone()),
            ClientError::ObjectLost { id, node, message } => ClientError::ObjectLost {
                id: *id,
                node: *node,
                message: message.clone(),
            },
            ClientError::MigRefused { refusal, message } => ClientError::MigRefused {
                refusal: *refusal,
                message: message.clone(),
            },
            ClientError::UnknownOutcome { call, key, cause } => ClientError::UnknownOutcome {
                call,
                key: key.clone(),
                cause: cause.clone(),
            },
            other => ClientError::Usage(other.to_string()),
        }
    }

    /// Maps an error status from the head at `url` to a client error.
    pub(crate) fn from_status(status: tonic::Status, url: &str) -> ClientError {
        if let Some(evicted) = Evicted::from_status(&status) {
            return ClientError::Evicted(evicted);
        }
        if let Some(refusal) = status
            .metadata()
            .get(MIG_REFUSAL_METADATA)
            .and_then(|v| v.to_str().ok())
            .and_then(MigRefusal::parse)
        {
            return ClientError::MigRefused {
                refusal,
                message: status.message().to_string(),
            };
        }
        if let Some((id, node)) = status
            .metadata()
            .get(escher_proto::types::OBJECT_LOST_METADATA)
            .and_then(|v| v.to_str().ok())
            .and_then(escher_proto::types::parse_object_lost)
        {
            return ClientError::ObjectLost {
                id,
                node,
                message: status.message().to_string(),
            };
        }
        match status.code() {
            Code::InvalidArgument | Code::FailedPrecondition => {
                ClientError::InvalidArgument(status.message().to_string())
            }
            // Only a watch is answered so: its revision is older than the head keeps.
            Code::OutOfRange => ClientError::HistoryExpired(status.message().to_string()),
            Code::NotFound => ClientError::NotFound(status.message().to_string()),
            Code::Unauthenticated => ClientError::Unauthenticated {
                message: status.message().to_string(),
                from: String::new(),
            },
            Code::PermissionDenied => ClientError::PermissionDenied(status.message().to_string()),
            Code::Unavailable => ClientError::Unavailable {
                url: url.to_string(),
                message: tls_hint(url, status_chain(&status)),
            },
            // A plain-text call to a head that speaks TLS is cut before any answer.
            Code::Unknown if url.starts_with("http://") && cut_short(status.message()) => {
                ClientError::Unavailable {
                    url: url.to_string(),
                    message: tls_hint(url, status_chain(&status)),
                }
            }
            _ => ClientError::Rpc(status),
        }
    }

    /// A connection failure to `url`, keeping the whole cause chain in the message.
    pub(crate) fn connect(url: &str, error: &(dyn StdError + 'static)) -> ClientError {
        ClientError::Connect {
            url: url.to_string(),
            cause: tls_hint(url, chain(error)),
        }
    }
}

/// Whether a failed call never left this machine: the connection to the replica could not be
/// made, so the replica cannot have applied anything.
#[cfg(feature = "grpc")]
pub(crate) fn never_sent(status: &tonic::Status) -> bool {
    let chain = status_chain(status);
    chain.contains("tcp connect error")
        || chain.contains("Connection refused")
        || chain.contains("error trying to connect")
}

/// Whether the replica refused the call because it is going away: an HTTP/2 GOAWAY without
/// an error, which a replica stopping gracefully sends on its connections. HTTP/2 refuses
/// every stream the GOAWAY does not cover, so the replica did not process the call, and
/// another may take it. (tonic reports it as INTERNAL.)
#[cfg(feature = "grpc")]
pub(crate) fn going_away(status: &tonic::Status) -> bool {
    let mut source = StdError::source(status);
    while let Some(cause) = source {
        if let Some(h2) = cause.downcast_ref::<h2::Error>() {
            return h2.is_go_away() && h2.reason() == Some(h2::Reason::NO_ERROR);
        }
        source = cause.source();
    }
    false
}

/// Whether a call's failure reads like a connection cut before any answer (what a head that
/// speaks TLS does to a plain-text call).
#[cfg(feature = "grpc")]
fn cut_short(message: &str) -> bool {
    [
        "transport error",
        "h2 protocol error",
        "http2 error",
        "connection reset",
    ]
    .iter()
    .any(|m| message.contains(m))
}

/// `cause`, with what to do when it looks like TLS went wrong.
#[cfg(feature = "grpc")]
fn tls_hint(url: &str, cause: String) -> String {
    if cause.contains("UnknownIssuer")
        || cause.contains("NotValidForName")
        || cause.contains("invalid peer certificate")
    {
        return format!(
            "{cause}; the head's certificate is not one this client trusts: use the head's \
             access file (ESCHER_ACCESS_FILE, or --access-file) or pass its certificate with --ca"
        );
    }
    if url.starts_with("http://") && cut_short(&cause) {
        return format!(
            "{cause}; if the head speaks TLS (its access file lists https:// URLs), use \
             https://{}",
            url.trim_start_matches("http://")
        );
    }
    cause
}

/// A status's message and the causes under it, each said once: a status's own `Display`
/// carries the debug form of its source (`source: tonic::transport::Error(Transport, ...)`),
/// which is no message for a person.
#[cfg(feature = "grpc")]
fn status_chain(status: &tonic::Status) -> String {
    let mut text = status.message().to_string();
    let mut source = StdError::source(status);
    while let Some(cause) = source {
        let more = cause.to_string();
        if !more.is_empty() && !text.contains(&more) {
            if !text.is_empty() {
                text.push_str(": ");
            }
            text.push_str(&more);
        }
        source = cause.source();
    }
    text
}

/// An error and its sources, joined with `: `, skipping a source whose text the previous one
/// already ends with.
#[cfg(feature = "grpc")]
fn chain(error: &(dyn StdError + 'static)) -> String {
    let mut text = error.to_string();
    let mut source = error.source();
    while let Some(cause) = source {
        let more = cause.to_string();
        if !more.is_empty() && !text.ends_with(&more) {
            text.push_str(": ");
            text.push_str(&more);
        }
        source = cause.source();
    }
    text
}

#[cfg(all(test, feature = "grpc"))]
mod tests {
    use super::*;

    const URL: &str = "http://127.0.0.1:7600";

    #[test]
    fn an_unreachable_head_is_said_in_words_not_debug_text() {
        let mut status = tonic::Status::unavailable("tcp connect error");
        let refused =
            std::io::Error::new(std::io::ErrorKind::ConnectionRefused, "Connection refused");
        status.set_source(std::sync::Arc::new(refused));
        let text = ClientError::from_status(status, URL).to_string();
        assert!(
            text.contains("tcp connect error: Connection refused"),
            "{text}"
        );
        assert!(
            !text.contains("source:") && !text.contains("code: '"),
            "{text}"
        );
    }

    #[test]
    fn head_statuses_map_to_typed_errors() {
        let msg = r#"tasks[0].resources["b@d"]: invalid resource name"#;
        let e = ClientError::from_status(tonic::Status::invalid_argument(msg), URL);
        assert!(matches!(&e, ClientError::InvalidArgument(m) if m == msg));
        assert_eq!(e.to_string(), msg, "the head's message is kept verbatim");
        assert!(!e.is_retryable());

        let e = ClientError::from_status(tonic::Status::failed_precondition("no"), URL);
        assert!(matches!(e, ClientError::InvalidArgument(_)));

        let e = ClientError::from_status(tonic::Status::not_found("task 9 is unknown"), URL);
        assert!(matches!(&e, ClientError::NotFound(m) if m == "task 9 is unknown"));
        assert!(!e.is_retryable());

        let evicted = Evicted {
            id: TaskId(9),
            tombstone: Some(escher_proto::types::Tombstone {
                state: TaskState::Succeeded,
                finished_at_ms: 1_795_428_000_000,
            }),
        };
        let e = ClientError::from_status(evicted.into_status(), URL);
        assert!(
            matches!(e, ClientError::Evicted(got) if got == evicted),
            "{e:?}"
        );
        assert!(
            e.to_string().contains("evicted by retention (succeeded at"),
            "{e}"
        );
        assert!(!e.is_retryable());

        let e = ClientError::from_status(tonic::Status::unavailable("connection reset"), URL);
        assert!(matches!(e, ClientError::Unavailable { .. }));
        assert!(e.is_retryable());
        let text = e.to_string();
        assert!(text.contains(URL) && text.contains("ESCHER_HEAD"), "{text}");

        let e = ClientError::from_status(tonic::Status::internal("boom"), URL);
        assert!(matches!(&e, ClientError::Rpc(s) if s.code() == Code::Internal));
        assert!(!e.is_retryable());
        assert!(e.to_string().contains("boom"), "{e}");

        for code in [
            Code::ResourceExhausted,
            Code::Aborted,
            Code::DeadlineExceeded,
        ] {
            let e = ClientError::from_status(tonic::Status::new(code, "later"), URL);
            assert!(e.is_retryable(), "{code:?}");
        }
    }

    #[test]
    fn a_refused_mig_change_says_why_as_a_type() {
        let mut status = tonic::Status::failed_precondition("GPU 0 of node 1 cannot be ...");
        status.metadata_mut().insert(
            MIG_REFUSAL_METADATA,
            tonic::metadata::MetadataValue::from_static("busy"),
        );
        let e = ClientError::from_status(status, URL);
        assert!(
            matches!(&e, ClientError::MigRefused { refusal: MigRefusal::Busy, message } if message.starts_with("GPU 0")),
            "{e:?}"
        );
        assert!(e.is_retryable() && e.is_refusal());
        let mut status = tonic::Status::invalid_argument("cannot create 1g.5gb@4 ...");
        status.metadata_mut().insert(
            MIG_REFUSAL_METADATA,
            tonic::metadata::MetadataValue::from_static("overlap"),
        );
        let e = ClientError::from_status(status, URL);
        assert!(matches!(
            e,
            ClientError::MigRefused {
                refusal: MigRefusal::Overlap,
                ..
            }
        ));
        assert!(!e.is_retryable());
        // A name this version does not know: the plain error, as before.
        let mut status = tonic::Status::invalid_argument("something new");
        status.metadata_mut().insert(
            MIG_REFUSAL_METADATA,
            tonic::metadata::MetadataValue::from_static("sideways"),
        );
        let e = ClientError::from_status(status, URL);
        assert!(matches!(e, ClientError::InvalidArgument(_)), "{e:?}");
    }

    #[test]
    fn task_outcomes_read_well() {
        let e = ClientError::TaskFailed {
            id: TaskId(4),
            state: TaskState::Failed,
            reason: "exit code 2".into(),
        };
        assert_eq!(e.to_string(), "task 4 failed: exit code 2");
        assert!(!e.is_retryable());
        let e = ClientError::Timeout {
            id: TaskId(4),
            after: Duration::from_secs(2),
        };
        assert_eq!(e.to_string(), "task 4 did not finish within 2s");
        assert!(e.is_retryable());
    }

    #[test]
    fn oversized_requests_say_what_to_do() {
        let e = ClientError::MessageTooLarge {
            call: "submit",
            size: 80,
            limit: 64,
        };
        assert_eq!(
            e.to_string(),
            "the submit request is 80 bytes, more than the 64 bytes a message to the head may \
             carry; pass large data by reference (a path or URL) instead of in function \
             arguments, or split the batch"
        );
        assert!(!e.is_retryable());
    }

    #[derive(Debug, Error)]
    #[error("outer")]
    struct Outer(#[source] Inner);
    #[derive(Debug, Error)]
    #[error("connection refused")]
    struct Inner;

    #[test]
    fn connect_errors_keep_the_cause_chain_and_the_hint() {
        let e = ClientError::connect(URL, &Outer(Inner));
        assert_eq!(
            e.to_string(),
            "cannot connect to the escher head at http://127.0.0.1:7600: outer: connection \
             refused (is escher-head running? set --head or ESCHER_HEAD)"
        );
        assert!(e.is_retryable());
    }
}

/// What an [`ClientError::UnknownOutcome`] tells its reader to do: a submit is sent again under
/// its key (`escher submit --key`); another write is checked before it is made again (a new
/// call carries a new key).
fn retry_hint(call: &str, key: &str) -> String {
    if call.starts_with("heads ") {
        // A membership change carries no key; made twice, the group refuses the second.
        "check whether it took effect before making it again (escher heads lists the members; \
         a change made again after it took effect is refused: already a member, or not a \
         member)"
            .to_string()
    } else if call == "submit" {
        format!(
            "retry it under the same idempotency key to apply it at most once (escher submit \
             --key {key} ...)"
        )
    } else {
        format!(
            "check whether it took effect before making it again (it was sent under \
             idempotency key {key}; a new call carries a new key)"
        )
    }
}
