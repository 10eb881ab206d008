//! [`WorkerError`]: what can go wrong when building or running a worker, or when a running
//! task calls the cluster through its [`TaskContext`](crate::TaskContext).
//!
//! The executor has its own error ([`ExecError`](crate::exec::ExecError)); the worker turns
//! those into task outcomes, not into `WorkerError`s. A head that is down or unreachable is not
//! an error either: the worker retries with back-off for as long as it runs. What remains is
//! split into the fatal (a configuration to fix, a head that refuses this worker) and the
//! retryable (a call from a task that the head could not serve now); see
//! [`WorkerError::is_retryable`].

use std::path::PathBuf;

use thiserror::Error;

/// An error of the worker library.
#[derive(Debug, Error)]
pub enum WorkerError {
    /// A configuration value is invalid; the message says which and why.
    #[error("invalid worker configuration: {field}: {why}")]
    InvalidConfig {
        /// The setting (`head`, `name`, `cpus`, ...), as the command-line flag names it.
        field: &'static str,
        /// What is wrong with it and what a valid value looks like.
        why: String,
    },

    /// Two functions were registered under one name.
    #[error("function {0:?} is registered twice; give each function its own name")]
    DuplicateFunction(String),

    /// The log directory could not be created.
    #[error("cannot create log directory {path}: {source}; check --log-dir and its permissions")]
    LogDir {
        /// The directory.
        path: PathBuf,
        /// The operating system's reason.
        #[source]
        source: std::io::Error,
    },

    /// The head refused to register this worker, for a reason that retrying will not fix
    /// (an invalid registration, or a server that is not an escher head).
    #[error("the head at {head} refused to register this worker: {status}")]
    Rejected {
        /// The head's URL.
        head: String,
        /// What it answered.
        status: tonic::Status,
    },

    /// A call to the head's `Cluster` service failed.
    #[error("{call} failed: {status}")]
    Rpc {
        /// Which call (`set_resources`, ...).
        call: &'static str,
        /// What the head (or the transport) answered.
        status: tonic::Status,
    },

    /// A write to the head whose outcome is not known: an attempt may have been applied and
    /// its answer never came (the connection broke after the request went out, or the replica
    /// had proposed it and stopped leading before it committed), and the call then failed.
    #[error("{call}: the outcome is unknown: {cause}")]
    UnknownOutcome {
        /// Which call (`set_resources`, ...).
        call: &'static str,
        /// What left the outcome open, then what the call ended with.
        cause: String,
    },

    /// The worker's state directory cannot be used.
    #[error(transparent)]
    StateDir(#[from] crate::identity::StateDirError),

    /// The head's answer could not be understood.
    #[error("{call}: the head answered with an invalid reply: {why}")]
    BadReply {
        /// Which call.
        call: &'static str,
        /// What was wrong with it.
        why: String,
    },
}

impl WorkerError {
    /// Whether trying the same thing again later may succeed: a [`WorkerError::Rpc`] whose
    /// status says the head was unavailable, overloaded or out of time. Everything else needs
    /// a change first.
    pub fn is_retryable(&self) -> bool {
        use tonic::Code;
        match self {
            WorkerError::Rpc { status, .. } => matches!(
                status.code(),
                Code::Unavailable
                    | Code::DeadlineExceeded
                    | Code::ResourceExhausted
                    | Code::Aborted
            ),
            _ => false,
        }
    }

    pub(crate) fn config(field: &'static str, why: impl Into<String>) -> WorkerError {
        WorkerError::InvalidConfig {
            field,
            why: why.into(),
        }
    }
}
