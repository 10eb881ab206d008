//! The errors scheduling libraries return.

use escher_client::ClientError;
use escher_proto::types::{MigRefusal, ResourceName, TypeError};
use thiserror::Error;

/// Why a policy could not do what was asked.
#[derive(Debug, Error)]
pub enum EslError {
    /// The cluster refused or could not be reached (the real client).
    #[error(transparent)]
    Client(#[from] ClientError),
    /// The in-memory cluster refused a call (what a real head would answer).
    #[error("{0}")]
    Refused(String),
    /// A name or amount the policy built was invalid.
    #[error(transparent)]
    Invalid(#[from] TypeError),
    /// A composed specification can never be satisfied.
    #[error("the composed requirements can never be satisfied: {0}")]
    Unsatisfiable(String),
    /// A resource the policy relies on is missing from the cluster.
    #[error("resource {0} is not present on any live node")]
    Missing(ResourceName),
    /// The policy gave up waiting.
    #[error("{what} did not happen within {after:?}")]
    Timeout {
        /// What was awaited.
        what: String,
        /// How long it waited.
        after: std::time::Duration,
    },
}

impl EslError {
    /// Why a MIG change was refused, when this is such a refusal.
    pub fn mig_refusal(&self) -> Option<MigRefusal> {
        match self {
            EslError::Client(e) => e.mig_refusal(),
            _ => None,
        }
    }

    /// Whether trying again later may succeed.
    pub fn is_retryable(&self) -> bool {
        match self {
            EslError::Client(e) => e.is_retryable(),
            EslError::Timeout { .. } => true,
            _ => false,
        }
    }
}
