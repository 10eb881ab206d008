//! Objects (docs/ARCHITECTURE.md "Objects"): values held by reference in the stores of the
//! workers that made or fetched them.
//!
//! [`ObjectId`] names an object, the same on every node that holds a copy.

use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Serialize};

use super::{Namespace, NodeId, TaskId};

/// Identifies an object for the life of the cluster: `(owner, index)`.
///
/// - A task's result objects are `(task id, index of the result)`: the same id whichever
///   attempt makes it, so that lineage rebuilds an object under the id it had.
/// - A `put`'s are `(session, sequence)`: the session number the head issues once per client
///   (never reused) and a sequence the client counts, so a `put` needs no round trip for its id.
///
/// The two spaces do not overlap because the head never hands out a session number that is
/// also a task id (docs/ARCHITECTURE.md, "Objects"). Printed `7.0` (owner, then index), with
/// the kind as a prefix in `Debug` (`object-7.0`).
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct ObjectId(pub u64, pub u64);

impl ObjectId {
    /// The task or session that owns the object.
    pub fn owner(self) -> u64 {
        self.0
    }

    /// The object's number among its owner's.
    pub fn index(self) -> u64 {
        self.1
    }

    /// The object that holds task `task`'s result when it is larger than
    /// [`INLINE_RESULT_BYTES`]: `(task, 0)`, whichever attempt makes it.
    pub fn task_result(task: TaskId) -> ObjectId {
        ObjectId(task.0, 0)
    }

    /// The local part of the ephemeral resource that marks a node holding a copy
    /// (`object.7.0`; the head qualifies it with the object's namespace, `NS/object.7.0`).
    pub fn location_name(self) -> String {
        format!("{LOCATION_PREFIX}{self}")
    }
}

/// The largest function result that travels inline, in the task's result through the head
/// (Ray's threshold, docs/ARCHITECTURE.md "Objects"); a larger one stays in the store of the
/// worker that made it ([`TaskResult::Object`](super::TaskResult::Object)).
pub const INLINE_RESULT_BYTES: usize = 100 * 1024;

/// What every object location resource's local part starts with (`object.` then the id).
pub const LOCATION_PREFIX: &str = "object.";

impl fmt::Display for ObjectId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}.{}", self.0, self.1)
    }
}

impl fmt::Debug for ObjectId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "object-{}.{}", self.0, self.1)
    }
}

/// Who owns an object: the party that counts its references and releases it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub enum ObjectOwner {
    /// A client's `put`: the session number the head issued to that client.
    Session(u64),
    /// A task's result.
    Task(TaskId),
}

impl fmt::Display for ObjectOwner {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ObjectOwner::Session(s) => write!(f, "session {s}"),
            ObjectOwner::Task(t) => write!(f, "task {t}"),
        }
    }
}

/// A copy of an object that a node sealed in its store, as reported to the head
/// (`ObjectsSealed`): whole, of this size and CRC-32C.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SealedCopy {
    /// The object.
    pub id: ObjectId,
    /// Its length in bytes.
    pub size: u64,
    /// The CRC-32C (Castagnoli) of its bytes, as the store computes it.
    pub checksum: u32,
    /// Who owns it.
    pub owner: ObjectOwner,
    /// Its namespace (`None`: the admin's).
    pub namespace: Option<Namespace>,
    /// The node whose store holds the copy.
    pub node: NodeId,
}

/// A copy in a worker's store, as the worker reports it after its stream attaches
/// (`ObjectsHeld`), so that the head adopts it or has it deleted (docs/ARCHITECTURE.md
/// "Objects", "Loss").
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct HeldCopy {
    /// The object.
    pub id: ObjectId,
    /// Its length in bytes.
    pub size: u64,
    /// The CRC-32C (Castagnoli) of its bytes.
    pub checksum: u32,
    /// The namespace it was stored for (`None`: the admin's).
    pub namespace: Option<Namespace>,
    /// The store's number for this copy: a copy stored again since has another.
    pub copy: u64,
}

/// A copy a worker reported held that the head's table does not count, with why: the worker
/// deletes it if its store still holds that copy (`DropCopies`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct DroppedHeld {
    /// The object.
    pub id: ObjectId,
    /// The store's number for the copy, as reported.
    pub copy: u64,
    /// Why.
    pub reason: String,
}

/// Why an object has no copy left.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ObjectLoss {
    /// The node that held its last copy.
    pub node: NodeId,
    /// Why that node went.
    pub reason: String,
}

/// One copy of an object, as a reader needs it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ObjectHolder {
    /// The node.
    pub node: NodeId,
    /// Its worker's data-plane address (`host:port`), if it published one.
    pub address: Option<String>,
    /// A ticket that lets the caller read the object there, if the head could sign one.
    pub ticket: Option<String>,
}

/// What the head knows of an object.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ObjectView {
    /// The object.
    pub id: ObjectId,
    /// Its namespace (`None`: the admin's).
    pub namespace: Option<Namespace>,
    /// Its length in bytes.
    pub size: u64,
    /// The CRC-32C of its bytes.
    pub checksum: u32,
    /// Who owns it.
    pub owner: ObjectOwner,
    /// When its first copy was sealed (milliseconds since the Unix epoch, the head's clock).
    pub sealed_at_ms: u64,
    /// Its copies, by node.
    pub holders: Vec<ObjectHolder>,
    /// Why it has no copy left, if so.
    pub lost: Option<ObjectLoss>,
}

/// A text that is not an object id.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0:?} is not an object id: expected OWNER.INDEX, two whole numbers (as in 7.0)")]
pub struct ParseObjectIdError(String);

impl FromStr for ObjectId {
    type Err = ParseObjectIdError;

    /// Parses `7.0`, or the same with the kind as a prefix (`object-7.0`).
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let t = s.trim();
        let t = t.strip_prefix("object-").unwrap_or(t);
        let parsed = t
            .split_once('.')
            .and_then(|(owner, index)| Some(ObjectId(owner.parse().ok()?, index.parse().ok()?)));
        parsed.ok_or_else(|| ParseObjectIdError(s.to_string()))
    }
}

/// The metadata entry of an error status that says an object is lost (every copy was on
/// nodes that are gone): `ID NODE`, the object and the node of its last copy; the status'
/// message says why that node went. The client makes it `ClientError::ObjectLost`.
pub const OBJECT_LOST_METADATA: &str = "escher-object-lost";

/// The [`OBJECT_LOST_METADATA`] value for object `id` last held by `node`.
pub fn format_object_lost(id: ObjectId, node: NodeId) -> String {
    format!("{id} {}", node.0)
}

/// The object and node an [`OBJECT_LOST_METADATA`] value names, if it is one.
pub fn parse_object_lost(value: &str) -> Option<(ObjectId, NodeId)> {
    let (id, node) = value.trim().split_once(' ')?;
    Some((id.parse().ok()?, NodeId(node.parse().ok()?)))
}

/// The task label that lists the objects a task takes as arguments: their ids joined by `+`
/// (`9223372036854775808.0+7.1`). The client's builders set it (`TaskBuilder::object_arg`);
/// the head checks each object is live in the task's namespace when it accepts the task,
/// orders them largest first, and places the task by default on a node that holds a copy of
/// the first that has room (soft locality); the worker fetches each before the task runs.
/// A label, not a field of the spec, so that tasks with object arguments are written in
/// every data format. A label's value is at most 256 bytes: about ten objects per task.
pub const OBJECTS_LABEL: &str = "escher.objects";

/// The objects an [`OBJECTS_LABEL`] value names, in its order (an empty value names none).
pub fn parse_object_args(value: &str) -> Result<Vec<ObjectId>, ParseObjectIdError> {
    value
        .split('+')
        .filter(|s| !s.trim().is_empty())
        .map(str::parse)
        .collect()
}

/// The [`OBJECTS_LABEL`] value that names `ids`, in order.
pub fn format_object_args(ids: &[ObjectId]) -> String {
    let parts: Vec<String> = ids.iter().map(ObjectId::to_string).collect();
    parts.join("+")
}

/// The task label that lists the tasks whose results a task reads (dataflow: a Python call
/// given another call's `TaskRef`), their ids joined by `+` (`12+15`). A result larger than
/// [`INLINE_RESULT_BYTES`] stays on the worker that made it, as object
/// [`ObjectId::task_result`]; the head places the task by default on a node holding a copy of
/// one of them when it has room (soft locality, after the [`OBJECTS_LABEL`] objects), and the
/// worker brings them into its store before the task runs. Those objects may not exist yet
/// when the task is accepted (their tasks still run), so the head checks only that the value
/// parses; a result kept inline, or another namespace's, simply gives no preference.
pub const RESULT_ARGS_LABEL: &str = "escher.result-args";

/// The tasks a [`RESULT_ARGS_LABEL`] value names, in its order (an empty value names none).
pub fn parse_result_args(value: &str) -> Result<Vec<TaskId>, std::num::ParseIntError> {
    value
        .split('+')
        .filter(|s| !s.trim().is_empty())
        .map(|s| s.trim().parse().map(TaskId))
        .collect()
}

/// The [`RESULT_ARGS_LABEL`] value that names `tasks`, in order.
pub fn format_result_args(tasks: &[TaskId]) -> String {
    let parts: Vec<String> = tasks.iter().map(|t| t.0.to_string()).collect();
    parts.join("+")
}

/// The task label that names the object session of the client that submitted the task (its
/// number in decimal): the task's result object, when its result is one, belongs to that
/// session, and goes when the session ends (its client closes, or it lapses), as the session's
/// `put` objects do. The client sets it on every submission made while it has a session open
/// (`Client::put` opens one); a task without it keeps its result until its reference's owner
/// releases it. The head takes only a session it gave out whose objects are of the task's
/// namespace; naming another client's session shortens nothing but the life of the task's own
/// result.
pub const OBJECT_SESSION_LABEL: &str = "escher.object-session";

/// The session an [`OBJECT_SESSION_LABEL`] value names, if it is a number.
pub fn parse_object_session(value: &str) -> Option<u64> {
    value.trim().parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn object_args_print_and_parse() {
        let ids = [ObjectId(1 << 63, 0), ObjectId(7, 1)];
        let text = format_object_args(&ids);
        assert_eq!(text, "9223372036854775808.0+7.1");
        assert_eq!(parse_object_args(&text), Ok(ids.to_vec()));
        assert_eq!(parse_object_args(""), Ok(Vec::new()));
        let tasks = [TaskId(12), TaskId(1 << 40)];
        let text = format_result_args(&tasks);
        assert_eq!(text, "12+1099511627776");
        assert_eq!(parse_result_args(&text), Ok(tasks.to_vec()));
        assert_eq!(parse_result_args(""), Ok(Vec::new()));
        assert!(parse_result_args("12+x").is_err());
        assert!(parse_object_args("7.0+x").is_err());
        let lost = format_object_lost(ObjectId(7, 1), NodeId(3));
        assert_eq!(parse_object_lost(&lost), Some((ObjectId(7, 1), NodeId(3))));
        assert_eq!(parse_object_lost("7.1"), None);
    }

    #[test]
    fn prints_and_parses() {
        let id = ObjectId(7, 0);
        assert_eq!(id.to_string(), "7.0");
        assert_eq!(format!("{id:?}"), "object-7.0");
        assert_eq!("7.0".parse::<ObjectId>(), Ok(id));
        assert_eq!(" object-7.0 ".parse::<ObjectId>(), Ok(id));
        assert_eq!((id.owner(), id.index()), (7, 0));
        for bad in ["7", "7.", ".0", "7.0.1", "a.b", "-1.0", ""] {
            let e = bad.parse::<ObjectId>().unwrap_err();
            assert!(e.to_string().contains("OWNER.INDEX"), "{bad}: {e}");
        }
    }
}
