//! The one error type of the domain types: every way a user-supplied value can be malformed.

use thiserror::Error;

/// A value supplied by a user (a name, an amount, a resource list) was not valid.
///
/// Every variant says what was wrong and, where it helps, what a valid value looks like.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum TypeError {
    /// A resource or namespace name broke the grammar.
    #[error("invalid resource name {name:?}: {why}")]
    InvalidName {
        /// The offending name (truncated if very long).
        name: String,
        /// Which rule it broke.
        why: &'static str,
    },
    /// An amount did not parse or is out of range.
    #[error("invalid amount {text:?}: {why}")]
    InvalidAmount {
        /// The offending text.
        text: String,
        /// Which rule it broke.
        why: &'static str,
    },
    /// Checked arithmetic on amounts overflowed or went below zero.
    #[error("amount arithmetic out of range: {0}")]
    Arithmetic(&'static str),
    /// A compact resource list (`cpu=2,gpu=0.5`) was malformed at a given position.
    #[error("invalid resource list at column {column} ({fragment:?}): {why}")]
    Syntax {
        /// 1-based column of the first byte of the bad fragment.
        column: usize,
        /// The fragment that could not be read.
        fragment: String,
        /// What was wrong with it.
        why: String,
    },
    /// The same resource appeared twice in one list.
    #[error("resource {0:?} is listed twice")]
    Duplicate(String),
    /// A label key or value was malformed.
    #[error("invalid label {text:?}: {why}")]
    InvalidLabel {
        /// The offending key or value.
        text: String,
        /// Which rule it broke.
        why: &'static str,
    },
    /// An id did not parse.
    #[error("invalid {what} id {text:?}: expected a non-negative integer")]
    InvalidId {
        /// `node` or `task`.
        what: &'static str,
        /// The offending text.
        text: String,
    },
    /// Another value (a role, a token request) was malformed.
    #[error("invalid {what} {value:?}: {why}")]
    Invalid {
        /// What kind of value.
        what: &'static str,
        /// The offending value.
        value: String,
        /// Which rule it broke, and what to give instead.
        why: &'static str,
    },
}
