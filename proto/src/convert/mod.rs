//! Conversions between the generated wire messages ([`crate::wire`]) and the domain types
//! ([`crate::types`]), the gRPC edge of every escher service.
//!
//! - `From<domain> for wire` never fails: a domain value is well-formed by construction.
//! - `TryFrom<wire> for domain` checks every field through the domain constructors
//!   ([`ResourceName::new`](crate::ResourceName::new), [`Amount::from_raw`](crate::Amount::from_raw),
//!   [`Labels::insert`](crate::Labels::insert), ...) and the limits below, and fails with a
//!   [`ConvertError`] that names the field path, e.g.
//!   `tasks[3].resources["b@d"]: invalid resource name "b@d": ...` or
//!   `missing field tasks[0].kind`. An unset `oneof` or an `UNSPECIFIED` enum value is an error,
//!   never a default.
//!
//! Resource sets travel as `repeated ResourceAmount` (`Vec<wire::ResourceAmount>`) and labels as
//! a `map<string, string>` (`BTreeMap<String, String>`), so those two conversions are between
//! the domain type and the collection. Amounts travel as their raw `u64` (1/10,000 units),
//! durations as whole milliseconds (rounded up).
//!
//! # Layout
//!
//! - `resources`: capacities, resource sets, labels, capacity operations, node specs, updates;
//! - `task`: task specs and kinds, states, results, statuses;
//! - `status`: cluster, node and resource status, pending reasons, task info and summaries;
//! - `cluster`: the requests and replies of the `Cluster` service;
//! - `reserve`: the `Reserve` call (head-native all-or-nothing reservations) and gang strategies;
//! - `gpu`: GPU inventories, device holds, the `Gpus` status and the `ApplyMigLayout` call;
//! - `retention`: the `Evicted` answer for a task retention dropped, carried on a status;
//! - `link`: the messages of the `WorkerLink` service;
//! - `link_names`: resource names sent once per worker stream ([`LinkEncoder`],
//!   [`LinkDecoder`]);
//! - `heads`: the replicas of a head group (`Heads`, `ChangeHeads`, a replica's status);
//! - `object`: object ids and what the head knows of an object (`LocateObject`, `ListObjects`);
//! - `watch`: the `Watch` call's request and the batches of events it streams;
//! - `telemetry`: task telemetry samples (`ReportTelemetry`, `Telemetry`).

use std::fmt;
use std::time::Duration;

use thiserror::Error;

use crate::types::TypeError;

mod actor;
mod auth;
mod cluster;
mod gpu;
mod heads;
mod link;
mod link_names;
mod object;
mod policy;
mod reserve;
mod resources;
mod retention;
mod status;
mod task;
mod telemetry;
mod watch;

#[cfg(test)]
mod testutil;

pub use auth::{MAX_DESCRIPTION_BYTES, tokens_from_wire};
pub use gpu::{MAX_DEVICES, MAX_GPUS, MAX_LAYOUT_BYTES, MAX_SLICES};
pub use heads::is_host_port;
pub use link::MAX_ASSIGNED_OBJECTS;
pub use link_names::{LinkDecoder, LinkEncoder, MAX_NAMES};
pub use object::{MAX_OBJECT_IDS, check_object_count, object_id, object_ids};
pub use policy::policy_report;
pub use retention::EVICTED_METADATA;
pub use telemetry::{report_samples, telemetry_tasks};

// A task spec's limits live with the domain types, so that the client's task builder checks
// them without the wire protocol (`escher-proto` without `grpc`).
pub use crate::types::{
    MAX_ARGV, MAX_ENV, MAX_HOOK_UPDATES, MAX_LABELS, MAX_NAME_BYTES, MAX_RESOURCES,
    MAX_TASK_NAME_BYTES,
};
/// The longest worker address, in bytes.
pub const MAX_ADDRESS_BYTES: usize = 1024;
/// The most metrics in one heartbeat.
pub const MAX_METRICS: usize = 1024;
/// The most bundles in one reservation.
pub const MAX_BUNDLES: usize = 4096;

/// Function arguments and results shorter than this are copied out of the message they came
/// in; longer ones share its buffer. A decoded `bytes` field is a slice of the whole received
/// message, and a head keeps a task's arguments while it is queued and its result after it
/// ended: a short one must not keep a batch of a thousand tasks alive, and a long one is most
/// of its message anyway.
pub const SHARE_BYTES_FROM: usize = 16 * 1024;

/// `bytes` received in a message, as the domain keeps them (see [`SHARE_BYTES_FROM`]).
pub(crate) fn kept(bytes: bytes::Bytes) -> bytes::Bytes {
    if bytes.len() < SHARE_BYTES_FROM {
        bytes::Bytes::copy_from_slice(&bytes)
    } else {
        bytes
    }
}

/// A wire message could not become a domain value: which field, and what was wrong with it.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
#[error("{}", Rendered { path: &self.path, problem: &self.problem })]
pub struct ConvertError {
    path: String,
    problem: Problem,
}

/// What was wrong with a field of a wire message.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum Problem {
    /// A required message or `oneof` was not set.
    #[error("missing field")]
    Missing,
    /// A value broke the rules of a domain type (a name, an amount, a label ...).
    #[error(transparent)]
    Invalid(#[from] TypeError),
    /// An enum field held a value that is unknown or `UNSPECIFIED`.
    #[error("unknown value {value}; expected one of {expected}")]
    UnknownEnum {
        /// The number received.
        value: i32,
        /// The names of the valid values.
        expected: &'static str,
    },
    /// A text or list that must not be empty was.
    #[error("must not be empty")]
    Empty,
    /// A text was longer than its limit.
    #[error("{len} bytes is longer than the limit of {max}")]
    TooLong {
        /// Its length in bytes.
        len: usize,
        /// The limit.
        max: usize,
    },
    /// A list had more entries than its limit.
    #[error("{len} entries is more than the limit of {max}")]
    TooMany {
        /// Its number of entries.
        len: usize,
        /// The limit.
        max: usize,
    },
    /// A text contained a NUL byte, which a process argument or environment cannot hold.
    #[error("contains a NUL byte")]
    Nul,
    /// A name or description held a control character (an escape sequence, a newline, ...),
    /// which would reach someone's terminal.
    #[error("contains the control character {0:?}; names and descriptions are printable text")]
    Control(char),
    /// A value broke a rule of the message; the text says which.
    #[error("{0}")]
    Rule(&'static str),
}

struct Rendered<'a> {
    path: &'a str,
    problem: &'a Problem,
}

impl fmt::Display for Rendered<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match (self.problem, self.path.is_empty()) {
            (Problem::Missing, true) => f.write_str("missing field"),
            (Problem::Missing, false) => write!(f, "missing field {}", self.path),
            (problem, true) => write!(f, "{problem}"),
            (problem, false) => write!(f, "{}: {problem}", self.path),
        }
    }
}

impl ConvertError {
    /// An error about the field at `path` (empty for the message itself).
    pub fn new(path: impl Into<String>, problem: Problem) -> ConvertError {
        ConvertError {
            path: path.into(),
            problem,
        }
    }

    /// A required field or `oneof` at `path` was not set.
    pub fn missing(path: impl Into<String>) -> ConvertError {
        ConvertError::new(path, Problem::Missing)
    }

    /// The path of the offending field, e.g. `tasks[3].resources["b@d"]`.
    pub fn path(&self) -> &str {
        &self.path
    }

    /// What was wrong with it.
    pub fn problem(&self) -> &Problem {
        &self.problem
    }

    /// The same error seen from the enclosing message, whose field `segment` holds this one.
    /// `segment` is a field name (`spec`), an indexed one (`tasks[3]`) or a key (`["b@d"]`).
    pub fn within(mut self, segment: &str) -> ConvertError {
        self.path = if self.path.is_empty() {
            segment.to_string()
        } else if self.path.starts_with('[') {
            format!("{segment}{}", self.path)
        } else {
            format!("{segment}.{}", self.path)
        };
        self
    }
}

impl From<TypeError> for ConvertError {
    /// A domain error about the current message as a whole (the caller adds the path).
    fn from(e: TypeError) -> ConvertError {
        ConvertError::new("", Problem::Invalid(e))
    }
}

impl From<ConvertError> for tonic::Status {
    fn from(e: ConvertError) -> tonic::Status {
        tonic::Status::invalid_argument(e.to_string())
    }
}

/// Puts a field name in front of the path of a failed conversion.
pub(crate) trait At<T> {
    /// Maps the error to one at `segment` (relative to the enclosing message).
    fn at(self, segment: &str) -> Result<T, ConvertError>;
}

impl<T> At<T> for Result<T, ConvertError> {
    fn at(self, segment: &str) -> Result<T, ConvertError> {
        self.map_err(|e| e.within(segment))
    }
}

impl<T> At<T> for Result<T, TypeError> {
    fn at(self, segment: &str) -> Result<T, ConvertError> {
        self.map_err(|e| ConvertError::new(segment, Problem::Invalid(e)))
    }
}

/// The value of a required field, or a `missing field` error.
pub(crate) fn required<T>(value: Option<T>, field: &str) -> Result<T, ConvertError> {
    value.ok_or_else(|| ConvertError::missing(field))
}

/// Converts a required message field.
pub(crate) fn convert_required<W, D>(value: Option<W>, field: &str) -> Result<D, ConvertError>
where
    D: TryFrom<W, Error = ConvertError>,
{
    D::try_from(required(value, field)?).at(field)
}

/// Converts an optional message field.
pub(crate) fn convert_optional<W, D>(
    value: Option<W>,
    field: &str,
) -> Result<Option<D>, ConvertError>
where
    D: TryFrom<W, Error = ConvertError>,
{
    value.map(|w| D::try_from(w).at(field)).transpose()
}

/// Fails if a list has more than `max` entries.
pub(crate) fn check_count(field: &str, len: usize, max: usize) -> Result<(), ConvertError> {
    if len > max {
        return Err(ConvertError::new(field, Problem::TooMany { len, max }));
    }
    Ok(())
}

/// Converts every entry of a repeated field of at most `max` entries, naming a bad one by index.
pub(crate) fn convert_list<W, D>(
    items: Vec<W>,
    field: &str,
    max: usize,
    mut convert: impl FnMut(W) -> Result<D, ConvertError>,
) -> Result<Vec<D>, ConvertError> {
    check_count(field, items.len(), max)?;
    items
        .into_iter()
        .enumerate()
        .map(|(i, w)| convert(w).map_err(|e| e.within(&format!("{field}[{i}]"))))
        .collect()
}

/// Fails if `text` is longer than `max` bytes.
pub(crate) fn check_len(field: &str, text: &str, max: usize) -> Result<(), ConvertError> {
    if text.len() > max {
        return Err(ConvertError::new(
            field,
            Problem::TooLong {
                len: text.len(),
                max,
            },
        ));
    }
    Ok(())
}

/// Fails if `text` is empty or longer than `max` bytes.
pub(crate) fn check_name(field: &str, text: &str, max: usize) -> Result<(), ConvertError> {
    if text.is_empty() {
        return Err(ConvertError::new(field, Problem::Empty));
    }
    check_len(field, text, max)
}

/// Fails if `text` holds a control character: names and descriptions that people read are
/// printable.
pub(crate) fn check_printable(field: &str, text: &str) -> Result<(), ConvertError> {
    match text.chars().find(|c| c.is_control()) {
        Some(c) => Err(ConvertError::new(field, Problem::Control(c))),
        None => Ok(()),
    }
}

/// Fails if `text` holds a NUL byte.
pub(crate) fn check_no_nul(field: &str, text: &str) -> Result<(), ConvertError> {
    if text.contains('\0') {
        return Err(ConvertError::new(field, Problem::Nul));
    }
    Ok(())
}

/// The path segment for a map key or a named entry: `["name"]`, shortened if very long.
pub(crate) fn key_segment(key: &str) -> String {
    const MAX: usize = 64;
    if key.len() <= MAX {
        return format!("[{key:?}]");
    }
    let mut end = MAX;
    while !key.is_char_boundary(end) {
        end -= 1;
    }
    format!("[{:?}...]", &key[..end])
}

/// A duration in whole milliseconds, rounded up so that a non-zero duration stays non-zero.
pub(crate) fn duration_to_ms(d: Duration) -> u64 {
    let ms = d.as_millis() + u128::from(!d.subsec_nanos().is_multiple_of(1_000_000));
    u64::try_from(ms).unwrap_or(u64::MAX)
}

/// A duration from milliseconds.
pub(crate) fn ms_to_duration(ms: u64) -> Duration {
    Duration::from_millis(ms)
}

/// Treats an empty string as absent.
pub(crate) fn non_empty(text: String) -> Option<String> {
    if text.is_empty() { None } else { Some(text) }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn paths_compose_like_rust_expressions() {
        let e = ConvertError::new("", Problem::Empty)
            .within("argv")
            .within("command")
            .within("tasks[3]");
        assert_eq!(e.path(), "tasks[3].command.argv");
        assert_eq!(e.to_string(), "tasks[3].command.argv: must not be empty");
        let e = ConvertError::missing("kind").within("spec");
        assert_eq!(e.to_string(), "missing field spec.kind");
        let e = ConvertError::new(key_segment("b@d"), Problem::Rule("bad")).within("resources");
        assert_eq!(e.path(), r#"resources["b@d"]"#);
        assert_eq!(ConvertError::missing("").to_string(), "missing field");
        assert_eq!(
            ConvertError::new("", Problem::Nul).to_string(),
            "contains a NUL byte"
        );
    }

    #[test]
    fn long_keys_are_shortened() {
        let long = "é".repeat(100);
        let seg = key_segment(&long);
        assert!(seg.len() < 80, "{seg}");
        assert!(seg.ends_with("...]"));
    }

    #[test]
    fn durations_round_up_to_whole_milliseconds() {
        assert_eq!(duration_to_ms(Duration::from_millis(1500)), 1500);
        assert_eq!(duration_to_ms(Duration::from_micros(1)), 1);
        assert_eq!(duration_to_ms(Duration::from_micros(2001)), 3);
        assert_eq!(duration_to_ms(Duration::ZERO), 0);
        assert_eq!(duration_to_ms(Duration::MAX), u64::MAX);
        assert_eq!(ms_to_duration(250), Duration::from_millis(250));
    }

    #[test]
    fn errors_become_invalid_argument() {
        let status = tonic::Status::from(ConvertError::missing("spec"));
        assert_eq!(status.code(), tonic::Code::InvalidArgument);
        assert_eq!(status.message(), "missing field spec");
    }

    #[test]
    fn short_bytes_leave_their_message_and_long_ones_share_it() {
        let message = bytes::Bytes::from(vec![7u8; 4 * SHARE_BYTES_FROM]);
        let short = message.slice(10..20);
        assert_ne!(kept(short.clone()).as_ptr(), short.as_ptr());
        assert_eq!(kept(short.clone()), short);
        let long = message.slice(0..SHARE_BYTES_FROM);
        assert_eq!(kept(long.clone()).as_ptr(), long.as_ptr());
        assert!(kept(message.slice(0..0)).is_empty());
    }
}
