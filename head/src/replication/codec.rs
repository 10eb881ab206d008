//! How replicated things are encoded: log entries (a batch of [`Entry`]s per raft entry,
//! bincode), snapshots (the whole [`ClusterState`] and the group's addresses, bincode), and the
//! address a membership change carries (UTF-8, in the conf-change entry's context).
//!
//! bincode's standard configuration (variable-length integers, little endian) is used for both;
//! it is fixed here, once, so that every replica and every restart reads what was written.
//!
//! # Data formats (DESIGN §14)
//!
//! The encoded layout of entries and snapshots is the **data format**, numbered. Format 1 is
//! the bincode of today's types, with no prefix (as every release so far wrote it). A later
//! format is written behind an envelope, `[0xFF, b'E', version (u16, little endian)]`, which
//! no format-1 value can start with (bincode's first byte of a format-1 entry batch or image is
//! a sequence length, and `0xFF` is none). This build reads every format up to
//! [`DATA_FORMAT`] and refuses a newer one naming both versions ([`CodecError::Newer`]), so a
//! replica is never wrong about what it cannot read.
//!
//! It writes the lowest format its group can read: format 1, unprefixed, as long as the layout
//! is unchanged. A build that changes an encoded type adds format 2, keeps decoding format 1
//! (fixtures of format 1 are in `tests/fixtures/data-format-1/` and a test opens them), and
//! writes format 2 only once every replica of its group reads it: so a group upgraded one
//! replica at a time keeps replicating throughout.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
use thiserror::Error;

use crate::state::{
    ClusterState, Entry, Incarnation, Lineage, ObjectTable, Registrations, StateConfig,
};

/// A replicated value could not be encoded or decoded.
#[derive(Debug, Error)]
pub enum CodecError {
    /// Encoding failed (a bug: every value here is encodable).
    #[error("cannot encode {what}: {source}")]
    Encode {
        /// What.
        what: &'static str,
        /// Why.
        source: bincode::error::EncodeError,
    },
    /// The bytes are not what this version writes (corruption, or another version).
    #[error(
        "cannot decode {what}: {source}; it is damaged, or was not written by an escher-head \
         (every data format a release wrote is read by the later ones)"
    )]
    Decode {
        /// What.
        what: &'static str,
        /// Why.
        source: bincode::error::DecodeError,
    },
    /// Written in a data format newer than this build reads.
    #[error(
        "{what} is in data format {found}, newer than this escher-head reads (formats 1 to \
         {supported}): it was written by a later release; run that release (or a later one) on \
         this replica"
    )]
    Newer {
        /// What.
        what: &'static str,
        /// The format of the bytes.
        found: u16,
        /// The newest format this build reads.
        supported: u16,
    },
}

/// The newest data format this build reads (and, while its group reads no newer one, the one it
/// writes; see the module documentation).
///
/// | format | what changed |
/// |---|---|
/// | 1 | the first: the bincode of the types, unprefixed |
/// | 2 | the same layout, behind the envelope; entries may hold actor tasks (`TaskKind::Actor`, the last variant, which a format-1 release cannot decode), so a group records actors only once every replica reads format 2 ([`ACTORS_FORMAT`]) |
/// | 3 | entries may hold `RegisterNodeUnattached`, `RejoinNodeUnattached` and `NodeAttached` (the last variants of `Command`): a node takes tasks only once its worker's stream is attached ([`ATTACH_FORMAT`]); a group writing an older format registers nodes as before |
/// | 4 | entries may hold `LabelNode` (a variant of `Command` after format 3's): labels set and removed on a live node, and a walltime's drain ([`LABELS_FORMAT`]) |
/// | 5 | entries may hold `ObjectsSealed`, `ObjectsReleased` and `OpenObjectSession` (the last variants of `Command`), and a snapshot carries the object table after the image: always the incarnation, then the table ([`OBJECTS_FORMAT`]); a group writing an older format refuses objects |
/// | 6 | entries may hold `RecordDecision` (the last variant of `Command`): an autoscaler's decisions, streamed to watchers ([`DECISIONS_FORMAT`]); a group writing an older format refuses them |
/// | 7 | entries and snapshots may hold `TaskResult::Object` (its last variant): a function's result above 100 KiB kept in its worker's store, the head holding its reference ([`RESULT_OBJECTS_FORMAT`]); a group writing an older format fails such an attempt, saying why |
/// | 8 | entries may hold `CloseObjectSession` (the last variant of `Command`; its reply, `Reply::ObjectSessionClosed`, the last of `Reply`): a session's objects released at once when its client closes or lapses ([`SESSIONS_FORMAT`]); a group writing an older format refuses a close, and its leader releases no lapsed session |
/// | 9 | entries may hold `RemoveJudgedNode` (the last variant of `Command`): a removal that names the registration its leader judged, and changes nothing once the node registered again; the registrations such entries apply are numbered, and a snapshot with numbers carries them after the object table ([`JUDGED_REMOVAL_FORMAT`]); a group writing an older format removes nodes with `RemoveNode`, as before |
/// | 10 | entries may hold `LabelNode` setting or removing `escher.disk.under-reserve`, which every replica's scheduler reads (a node under its disk reserve takes nothing new): the leader sets it from its workers' heartbeats only while the group writes format 10 ([`DISK_RESERVE_FORMAT`]), as a format-9 replica would place tasks there regardless |
/// | 11 | entries may hold `SubmitChildren` and `CancelTasks` (the last variants of `Command`): a task submitted from inside a running task is recorded with its parent, and a cancel may be recursive (the task's descendants with it) or forced (no SIGTERM grace); a snapshot with parents carries them after the registration numbers ([`PARENT_TASK_FORMAT`]); a group writing an older format submits with `Submit` (no parent recorded), cancels with `Cancel`, and refuses a forced cancel |
pub const DATA_FORMAT: u16 = 11;

/// The first data format whose entries may hold actors: a group accepts an actor only when it
/// writes this format or a later one.
pub const ACTORS_FORMAT: u16 = 2;

/// The first data format whose entries may hold the registration that waits for the worker's
/// stream (`escher_core::state` `nodes.rs`): a leader proposes it only when its group writes
/// this format or a later one.
pub const ATTACH_FORMAT: u16 = 3;

/// The first data format whose entries may hold `LabelNode`: the head refuses `escher node
/// label` (and drains no walltime) while its group writes an older one.
pub const LABELS_FORMAT: u16 = 4;

/// The first data format whose entries may hold object commands and whose snapshots carry the
/// object table: a group records objects only when it writes this format or a later one.
pub const OBJECTS_FORMAT: u16 = 5;

/// The first data format whose entries may hold `RecordDecision`: a group records decisions
/// (for the watch API) only when it writes this format or a later one.
pub const DECISIONS_FORMAT: u16 = 6;

/// The first data format whose entries and snapshots may hold a task result kept as an object
/// (`TaskResult::Object`): a group still writing an older one fails the attempt that made it.
pub const RESULT_OBJECTS_FORMAT: u16 = 7;

/// The first data format whose entries may hold `CloseObjectSession`: a client's close is
/// refused, and a lapsed session's objects stay, while the group writes an older one.
pub const SESSIONS_FORMAT: u16 = 8;

/// The first data format whose entries may hold `RemoveJudgedNode` and number the
/// registrations they apply (`escher_core::state` `registrations.rs`), and whose snapshots
/// carry those numbers: a leader removes nodes with it only when its group writes this format
/// or a later one.
pub const JUDGED_REMOVAL_FORMAT: u16 = 9;

/// Whether an entry of data format `format` numbers the registrations it applies.
pub(crate) fn numbers_registrations(format: u16) -> bool {
    format >= JUDGED_REMOVAL_FORMAT
}

/// The first data format whose replicas hold a node labelled under its disk reserve out of
/// placement: the leader labels such a node only while its group writes this format or a
/// later one.
pub const DISK_RESERVE_FORMAT: u16 = 10;

/// The first data format whose entries may hold `SubmitChildren` and `CancelTasks`, and whose
/// snapshots carry each task's parent (`escher_core::state` `lineage.rs`): a leader records
/// parents, and forces or recurses a cancel, only when its group writes this format or a
/// later one.
pub const PARENT_TASK_FORMAT: u16 = 11;

/// The start of a data-format envelope (formats from 2 on).
const ENVELOPE: [u8; 2] = [0xFF, b'E'];

/// A test seam (named so): `ESCHER_TEST_NEXT_DATA_FORMAT=1` in a replica's environment makes it
/// behave as the next release would, reading and writing data format `DATA_FORMAT + 1`, whose
/// layout is this build's behind the envelope. A replica without it refuses those bytes as a
/// release of today refuses a later one's, so the rolling-upgrade tests replace the replicas of
/// a group one by one with "the next release" without building a second escher-head.
pub const ENV_NEXT_FORMAT: &str = "ESCHER_TEST_NEXT_DATA_FORMAT";

/// The newest data format this replica reads: [`DATA_FORMAT`], or one more under the test
/// seam [`ENV_NEXT_FORMAT`].
pub fn newest_readable() -> u16 {
    static NEWEST: std::sync::OnceLock<u16> = std::sync::OnceLock::new();
    *NEWEST.get_or_init(|| {
        if std::env::var_os(ENV_NEXT_FORMAT).is_some_and(|v| v == "1") {
            tracing::warn!(
                "{ENV_NEXT_FORMAT}=1: this replica acts as the next release (data format {}), \
                 a test seam",
                DATA_FORMAT + 1
            );
            DATA_FORMAT + 1
        } else {
            DATA_FORMAT
        }
    })
}

/// The data format of `bytes` and the encoded value after its envelope, if it has one.
fn unwrap<'a>(bytes: &'a [u8], what: &'static str) -> Result<(u16, &'a [u8]), CodecError> {
    match bytes {
        [a, b, lo, hi, rest @ ..] if [*a, *b] == ENVELOPE => {
            let found = u16::from_le_bytes([*lo, *hi]);
            let supported = newest_readable();
            if found > supported {
                return Err(CodecError::Newer {
                    what,
                    found,
                    supported,
                });
            }
            Ok((found, rest))
        }
        _ => Ok((1, bytes)),
    }
}

/// `body` (this build's layout) as data format `format`: bare for format 1, behind the envelope
/// after it.
fn wrap(format: u16, body: Vec<u8>) -> Vec<u8> {
    if format <= 1 {
        return body;
    }
    let mut out = Vec::with_capacity(body.len() + 4);
    out.extend_from_slice(&ENVELOPE);
    out.extend_from_slice(&format.to_le_bytes());
    out.extend_from_slice(&body);
    out
}

fn config() -> bincode::config::Configuration {
    bincode::config::standard()
}

/// Encodes the entries of one raft log entry in data format `format` (one this build reads).
pub(crate) fn encode_batch(entries: &[Entry], format: u16) -> Result<Vec<u8>, CodecError> {
    bincode::serde::encode_to_vec(entries, config())
        .map(|body| wrap(format, body))
        .map_err(|source| CodecError::Encode {
            what: "a log entry",
            source,
        })
}

/// Decodes the entries of one raft log entry, of any data format this build reads, and tells
/// which format it was.
pub(crate) fn decode_batch(bytes: &[u8]) -> Result<(u16, Vec<Entry>), CodecError> {
    // Format 1 is the only layout so far: every version decodes alike.
    let (format, bytes) = unwrap(bytes, "a log entry")?;
    bincode::serde::decode_from_slice(bytes, config())
        .map(|(entries, _)| (format, entries))
        .map_err(|source| CodecError::Decode {
            what: "a log entry",
            source,
        })
}

/// What a snapshot holds, as written.
#[derive(Serialize)]
struct ImageRef<'a> {
    state: &'a ClusterState,
    members: &'a BTreeMap<u64, String>,
}

/// What a snapshot holds, as read.
#[derive(Deserialize)]
struct Image {
    state: ClusterState,
    members: BTreeMap<u64, String>,
}

/// Encodes a snapshot of `state` and the group's replica addresses in data format `format`.
///
/// The state's incarnation (`escher_core::state::Incarnation`) follows the image, when the
/// state was ever restored from a backup: a reader decodes the image and then, if bytes are
/// left, the incarnation. So an image without it (every image before it existed) reads as the
/// first incarnation, and a reader that knows nothing of it reads the image and ignores what
/// follows (bincode reads a value and says how many bytes it took).
///
/// From [`OBJECTS_FORMAT`] on, the incarnation is always written and the object table follows
/// it (a reader of such a format reads both). A state with objects written in an older format
/// (a backup, which is format 1 when it can be) would lose them, so such a state is written in
/// [`OBJECTS_FORMAT`] whatever `format` says.
pub(crate) fn encode_image(
    state: &ClusterState,
    members: &BTreeMap<u64, String>,
    format: u16,
) -> Result<Vec<u8>, CodecError> {
    let encode_error = |source| CodecError::Encode {
        what: "a snapshot",
        source,
    };
    let format = if state.objects().is_empty() {
        format
    } else {
        format.max(OBJECTS_FORMAT)
    };
    // A task result kept as an object is a variant a release before format 7 cannot decode:
    // such an image says so in its header, and an older release refuses it by name.
    let result_objects = state.task_records().any(|(_, rec)| {
        matches!(
            rec.result.as_deref(),
            Some(escher_proto::types::TaskResult::Object { .. })
        )
    });
    let format = if result_objects {
        format.max(RESULT_OBJECTS_FORMAT)
    } else {
        format
    };
    // Registration numbers are only made by entries of their format, so a state that has
    // some is written in it (every replica of its group reads it).
    let format = if state.registrations().is_empty() {
        format
    } else {
        format.max(JUDGED_REMOVAL_FORMAT)
    };
    // Parents are only recorded by entries of their format: the same.
    let format = if state.lineage().is_empty() {
        format
    } else {
        format.max(PARENT_TASK_FORMAT)
    };
    let mut body = bincode::serde::encode_to_vec(ImageRef { state, members }, config())
        .map_err(encode_error)?;
    let incarnation = state.incarnation();
    if format >= OBJECTS_FORMAT || *incarnation != Incarnation::default() {
        body.extend(bincode::serde::encode_to_vec(incarnation, config()).map_err(encode_error)?);
    }
    if format >= OBJECTS_FORMAT {
        body.extend(
            bincode::serde::encode_to_vec(state.objects(), config()).map_err(encode_error)?,
        );
    }
    if format >= JUDGED_REMOVAL_FORMAT {
        body.extend(
            bincode::serde::encode_to_vec(state.registrations(), config()).map_err(encode_error)?,
        );
    }
    if format >= PARENT_TASK_FORMAT {
        body.extend(
            bincode::serde::encode_to_vec(state.lineage(), config()).map_err(encode_error)?,
        );
    }
    Ok(wrap(format, body))
}

/// Encodes a backup of `state`: a snapshot image with no replica addresses (the group that is
/// restored from it names its own), in data format 1, which every release reads.
pub fn encode_backup(state: &ClusterState) -> Result<Vec<u8>, CodecError> {
    encode_image(state, &BTreeMap::new(), 1)
}

/// The data format a snapshot image or backup image is written in (1 for one without the
/// envelope). What a backup's header states, so that a restore can refuse a later release's
/// backup by its header alone.
pub fn image_format(bytes: &[u8]) -> u16 {
    match bytes {
        [a, b, lo, hi, ..] if [*a, *b] == ENVELOPE => u16::from_le_bytes([*lo, *hi]),
        _ => 1,
    }
}

/// Decodes a backup image (see [`encode_backup`]) into a state that applies `config`.
pub fn decode_backup(bytes: &[u8], config_: StateConfig) -> Result<ClusterState, CodecError> {
    decode_image(bytes, config_).map(|(state, _, _)| state)
}

/// A decoded snapshot: the state, the replica addresses, and the data format it was written in.
pub(crate) type Decoded = (ClusterState, BTreeMap<u64, String>, u16);

/// Decodes a snapshot into a state that applies `config`, and the replica addresses.
pub(crate) fn decode_image(bytes: &[u8], config_: StateConfig) -> Result<Decoded, CodecError> {
    let (format, bytes) = unwrap(bytes, "a snapshot")?;
    let decode_error = |source| CodecError::Decode {
        what: "a snapshot",
        source,
    };
    let (image, read): (Image, usize) =
        bincode::serde::decode_from_slice(bytes, config()).map_err(decode_error)?;
    let mut state = image.state.restore(config_);
    if let Some(rest) = bytes.get(read..).filter(|rest| !rest.is_empty()) {
        let (incarnation, used): (Incarnation, usize) =
            bincode::serde::decode_from_slice(rest, config()).map_err(decode_error)?;
        state.set_incarnation(incarnation);
        if format >= OBJECTS_FORMAT {
            let rest = &rest[used..];
            let (objects, used): (ObjectTable, usize) =
                bincode::serde::decode_from_slice(rest, config()).map_err(decode_error)?;
            state.set_objects(objects);
            if format >= JUDGED_REMOVAL_FORMAT {
                let rest = &rest[used..];
                let (numbers, used): (Registrations, usize) =
                    bincode::serde::decode_from_slice(rest, config()).map_err(decode_error)?;
                state.set_registrations(numbers);
                if format >= PARENT_TASK_FORMAT {
                    let (lineage, _): (Lineage, usize) =
                        bincode::serde::decode_from_slice(&rest[used..], config())
                            .map_err(decode_error)?;
                    state.set_lineage(lineage);
                }
            }
        }
    }
    Ok((state, image.members, format))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::state::Command;

    #[test]
    fn entries_and_images_round_trip() {
        let batch = vec![Entry::new(42, Command::Tick), Entry::new(42, Command::Tick)];
        assert_eq!(
            decode_batch(&encode_batch(&batch, 1).unwrap()).unwrap(),
            (1, batch)
        );
        assert!(decode_batch(&[0xff, 0xff, 0xff]).is_err());
        let state = ClusterState::new(StateConfig::default());
        let members = BTreeMap::from([(1, "127.0.0.1:7600".to_string())]);
        let bytes = encode_image(&state, &members, 1).unwrap();
        let (back, m, format) = decode_image(&bytes, StateConfig::default()).unwrap();
        assert_eq!((&m, format), (&members, 1));
        assert_eq!(encode_image(&back, &m, 1).unwrap(), bytes);
    }

    #[test]
    fn an_image_with_objects_carries_the_table_in_the_objects_format() {
        use escher_proto::types::{ObjectId, ObjectOwner, SealedCopy};
        let mut state = ClusterState::new(StateConfig::default());
        state
            .apply(Entry::new(
                1,
                Command::Init {
                    cluster_id: "c".into(),
                    task_key: "k".into(),
                },
            ))
            .unwrap();
        let empty = encode_image(&state, &BTreeMap::new(), 1).unwrap();
        assert_eq!(decode_image(&empty, StateConfig::default()).unwrap().2, 1);
        state
            .apply(Entry::new(2, Command::OpenObjectSession))
            .unwrap();
        // A session given out is part of the table: a backup (format 1 when it can be) keeps it.
        let backup = encode_backup(&state).unwrap();
        let (back, _, format) = decode_image(&backup, StateConfig::default()).unwrap();
        assert_eq!(format, OBJECTS_FORMAT);
        assert_eq!(back.objects(), state.objects());
        // A copy on a node the state does not have is dropped, so the table holds no object;
        // the image still round-trips byte for byte.
        let copy = SealedCopy {
            id: ObjectId(1 << 63, 0),
            size: 3,
            checksum: 7,
            owner: ObjectOwner::Session(1 << 63),
            namespace: None,
            node: escher_proto::types::NodeId(9),
        };
        state
            .apply(Entry::new(3, Command::ObjectsSealed { copies: vec![copy] }))
            .unwrap();
        let image = encode_image(&state, &BTreeMap::new(), DATA_FORMAT).unwrap();
        let (back, _, _) = decode_image(&image, StateConfig::default()).unwrap();
        assert_eq!(
            encode_image(&back, &BTreeMap::new(), DATA_FORMAT).unwrap(),
            image
        );
    }

    #[test]
    fn an_image_keeps_a_restored_states_incarnation_and_one_without_reads_as_the_first() {
        let mut state = ClusterState::new(StateConfig::default());
        state
            .apply(Entry::new(
                1,
                Command::Init {
                    cluster_id: "c".into(),
                    task_key: "k".into(),
                },
            ))
            .unwrap();
        let plain = encode_image(&state, &BTreeMap::new(), 1).unwrap();
        let state = decode_backup(&plain, StateConfig::default())
            .unwrap()
            .restored_from_backup(1_000);
        let pending = encode_image(&state, &BTreeMap::new(), 1).unwrap();
        assert!(
            pending.len() > plain.len(),
            "the incarnation follows the image"
        );
        let mut back = decode_backup(&pending, StateConfig::default()).unwrap();
        assert_eq!(back.incarnation().pending, Some(1_000));
        back.apply(Entry::new(2_000, Command::Tick)).unwrap();
        let begun = back.incarnation().clone();
        assert_eq!((begun.number, begun.pending), (1, None));
        let again = encode_image(&back, &BTreeMap::new(), 1).unwrap();
        let read = decode_backup(&again, StateConfig::default()).unwrap();
        assert_eq!(read.incarnation(), &begun);
        assert_eq!(read.next_task_id(), back.next_task_id());
        // An image from before incarnations: the first one.
        let old = decode_backup(&plain, StateConfig::default()).unwrap();
        assert_eq!(old.incarnation(), &Incarnation::default());
    }

    /// A named state with one live node, registered by an entry of data format `format`.
    fn one_node(format: u16) -> (ClusterState, escher_proto::types::NodeId) {
        let mut state = ClusterState::new(StateConfig::default());
        let init = Command::Init {
            cluster_id: "c".into(),
            task_key: "k".into(),
        };
        state.apply(Entry::new(1, init)).unwrap();
        let worker = crate::state::Joining {
            name: "w".into(),
            address: String::new(),
            resources: "cpu=1".parse().unwrap(),
            labels: Default::default(),
            gpus: Vec::new(),
            boot: 1,
        };
        let secret = crate::state::SecretHash::of("s");
        let register = Entry::new(2, Command::RegisterNode { worker, secret });
        match state.apply_entry(register, numbers_registrations(format)) {
            Ok(crate::state::Reply::Registered(node)) => (state, node),
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn a_log_of_format_8_with_the_plain_removal_still_replays() {
        use escher_proto::types::NodeId;
        // A batch as format 8 wrote it, byte by byte: the envelope, one entry (now 7),
        // `RemoveNode` (variant 5) of node 1 for reason "x", no idempotency key. The variant
        // kept its number: `RemoveJudgedNode` went last.
        let bytes = [0xFF, b'E', 8, 0, 1, 7, 5, 1, 1, b'x', 0];
        let (format, entries) = decode_batch(&bytes).unwrap();
        let remove = Command::RemoveNode {
            node: NodeId(1),
            reason: "x".into(),
        };
        assert_eq!((format, entries.clone()), (8, vec![Entry::new(7, remove)]));
        assert!(!numbers_registrations(format));
        // Replayed as a replica replays it: the node's registration (of format 8 too) has no
        // number, and the plain removal removes it.
        let (mut state, node) = one_node(8);
        assert_eq!((node, state.registration(node)), (NodeId(1), None));
        for entry in entries {
            state
                .apply_entry(entry, numbers_registrations(format))
                .unwrap();
        }
        assert!(!state.node_alive(node));
        // Format 8's snapshot of a state without numbers has no trailer for them and reads.
        let (state, node) = one_node(8);
        let image = encode_image(&state, &BTreeMap::new(), 8).unwrap();
        assert_eq!(image_format(&image), 8);
        let (back, _, _) = decode_image(&image, StateConfig::default()).unwrap();
        assert!(back.node_alive(node) && back.registrations().is_empty());
    }

    #[test]
    fn parents_are_in_the_snapshot_of_their_format_and_their_commands_too() {
        use crate::state::Reply;
        let (mut state, _) = one_node(JUDGED_REMOVAL_FORMAT);
        // A format-10 image of a state without parents carries none, and reads.
        let plain = encode_image(&state, &BTreeMap::new(), DISK_RESERVE_FORMAT).unwrap();
        assert_eq!(image_format(&plain), DISK_RESERVE_FORMAT);
        let (back, _, _) = decode_image(&plain, StateConfig::default()).unwrap();
        assert!(back.lineage().is_empty());

        let spec = || escher_proto::types::TaskSpec {
            name: "t".into(),
            kind: escher_proto::types::TaskKind::Command {
                argv: vec!["true".into()],
                env: Vec::new(),
                cwd: None,
            },
            resources: "cpu=1".parse().unwrap(),
            labels: Default::default(),
            max_retries: 0,
            timeout: None,
            pending_deadline: None,
            on_start: Vec::new(),
            on_success: Vec::new(),
        };
        let submit = Command::Submit {
            tasks: vec![spec()],
            namespace: None,
        };
        let Ok(Reply::Submitted(ids)) = state.apply(Entry::new(3, submit)) else {
            panic!("submitted");
        };
        let children = Command::SubmitChildren {
            tasks: vec![spec(), spec()],
            namespace: None,
            parent: ids[0],
        };
        // The entry of format 11 round-trips, and so does a cancel with its options.
        let cancel = Command::CancelTasks {
            tasks: vec![ids[0]],
            recursive: true,
            force: true,
        };
        let batch = vec![Entry::new(4, children.clone()), Entry::new(5, cancel)];
        let bytes = encode_batch(&batch, PARENT_TASK_FORMAT).unwrap();
        assert_eq!(decode_batch(&bytes).unwrap(), (PARENT_TASK_FORMAT, batch));
        let Ok(Reply::Submitted(kids)) = state.apply(Entry::new(4, children)) else {
            panic!("submitted");
        };
        // Asked for an older format (a backup's 1 included), a state with parents is written
        // in theirs, and reads back with them.
        for asked in [1, DISK_RESERVE_FORMAT] {
            let image = encode_image(&state, &BTreeMap::new(), asked).unwrap();
            assert_eq!(image_format(&image), PARENT_TASK_FORMAT);
            let (back, _, _) = decode_image(&image, StateConfig::default()).unwrap();
            assert_eq!(back.lineage(), state.lineage());
            for kid in &kids {
                assert_eq!(back.parent_of(*kid), Some(ids[0]));
            }
            assert_eq!(
                encode_image(&back, &BTreeMap::new(), PARENT_TASK_FORMAT).unwrap(),
                encode_image(&state, &BTreeMap::new(), PARENT_TASK_FORMAT).unwrap()
            );
        }
    }

    #[test]
    fn registration_numbers_are_in_the_snapshot_of_their_format_and_the_judged_removal_too() {
        let (state, node) = one_node(JUDGED_REMOVAL_FORMAT);
        let number = state.registration(node);
        assert!(number.is_some());
        // Asked for an older format, a state with numbers is written in theirs.
        let image = encode_image(&state, &BTreeMap::new(), 8).unwrap();
        assert_eq!(image_format(&image), JUDGED_REMOVAL_FORMAT);
        let (back, _, _) = decode_image(&image, StateConfig::default()).unwrap();
        assert_eq!(back.registrations(), state.registrations());
        assert_eq!(
            encode_image(&back, &BTreeMap::new(), JUDGED_REMOVAL_FORMAT).unwrap(),
            image
        );
        let judged = Command::RemoveJudgedNode {
            node,
            registration: number,
            reason: "r".into(),
        };
        let batch = vec![Entry::new(9, judged)];
        let bytes = encode_batch(&batch, JUDGED_REMOVAL_FORMAT).unwrap();
        assert_eq!(
            decode_batch(&bytes).unwrap(),
            (JUDGED_REMOVAL_FORMAT, batch)
        );
    }

    #[test]
    fn format_one_is_written_bare_read_in_an_envelope_too_and_a_newer_one_is_refused() {
        let batch = vec![Entry::new(7, Command::Tick)];
        let bare = encode_batch(&batch, 1).unwrap();
        assert_ne!(bare[0], 0xFF, "format 1 is written without an envelope");
        let mut wrapped = vec![0xFF, b'E', 1, 0];
        wrapped.extend_from_slice(&bare);
        assert_eq!(decode_batch(&wrapped).unwrap(), (1, batch.clone()));
        // This release's format is written in its envelope, and read.
        let this = encode_batch(&batch, DATA_FORMAT).unwrap();
        assert_eq!(this[..4], [0xFF, b'E', DATA_FORMAT.to_le_bytes()[0], 0]);
        assert_eq!(decode_batch(&this).unwrap(), (DATA_FORMAT, batch.clone()));

        // What the next release writes (its envelope) is what this one refuses.
        let next = DATA_FORMAT + 1;
        let mut newer = vec![0xFF, b'E'];
        newer.extend_from_slice(&next.to_le_bytes());
        newer.extend_from_slice(&bare);
        let err = decode_batch(&newer).unwrap_err();
        assert!(matches!(
            err,
            CodecError::Newer { found, supported: DATA_FORMAT, .. } if found == next
        ));
        let text = err.to_string();
        assert!(
            text.contains(&format!("data format {next}"))
                && text.contains(&format!("formats 1 to {DATA_FORMAT}")),
            "{text}"
        );
        let state = ClusterState::new(StateConfig::default());
        let mut image = vec![0xFF, b'E'];
        image.extend_from_slice(&next.to_le_bytes());
        image.extend(encode_image(&state, &BTreeMap::new(), 1).unwrap());
        let err = decode_image(&image, StateConfig::default()).unwrap_err();
        assert!(
            err.to_string().contains(&format!("data format {next}")),
            "{err}"
        );
    }
}
