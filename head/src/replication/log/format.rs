//! The bytes on disk: file headers, checksummed records, and the payload of each record kind.
//!
//! Every file starts with a 16-byte header `[magic: 8][format version: u32][crc32c: u32]`, the
//! checksum covering the 12 bytes before it. Records follow, each
//! `[len: u32][crc32c: u32][kind: u8][payload: len bytes]`, the checksum covering `len`, `kind`
//! and the payload, so a flipped bit anywhere in a record, its length included, fails the check.
//! Integers are little-endian. raft's own messages (`Entry`, `HardState`, `ConfState`,
//! `Snapshot`) are stored in their protobuf encoding, the format raft-rs defines for them.
//!
//! | kind | payload |
//! |---|---|
//! | 1 entries | `[count: u32]`, then per entry `[len: u32][Entry]`: truncate from the first index, append |
//! | 2 hard state | `HardState` |
//! | 3 conf state | `ConfState` |
//! | 4 snapshot | `[first segment: u64][len: u32][HardState][len: u32][ConfState][Snapshot]` |
//! | 5 sync | empty: ends each write that `sync` makes durable |

use std::path::Path;

use protobuf::Message;
use raft::eraftpb::{ConfState, Entry, HardState, Snapshot};

use super::LogError;

/// The format version this build writes and reads.
pub(super) const FORMAT_VERSION: u32 = 1;
/// Bytes in a file header.
pub(super) const HEADER_LEN: usize = 16;
/// Bytes in a record header (`len`, `crc`, `kind`).
pub(super) const RECORD_HEADER_LEN: usize = 9;

/// The two kinds of file with a header.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum FileKind {
    /// A log segment.
    Segment,
    /// A snapshot file.
    Snapshot,
}

impl FileKind {
    fn magic(self) -> &'static [u8; 8] {
        match self {
            FileKind::Segment => b"ESCHRLOG",
            FileKind::Snapshot => b"ESCHSNAP",
        }
    }

    fn name(self) -> &'static str {
        match self {
            FileKind::Segment => "segment",
            FileKind::Snapshot => "snapshot",
        }
    }
}

/// The header a new file of `kind` starts with.
pub(super) fn header(kind: FileKind) -> [u8; HEADER_LEN] {
    let mut h = [0u8; HEADER_LEN];
    h[..8].copy_from_slice(kind.magic());
    h[8..12].copy_from_slice(&FORMAT_VERSION.to_le_bytes());
    let crc = crc32c::crc32c(&h[..12]);
    h[12..].copy_from_slice(&crc.to_le_bytes());
    h
}

/// Checks the header at the start of `bytes`, the contents of the file at `path`: `Ok(true)`
/// when intact, `Ok(false)` when too short or its checksum fails (torn or damaged: the caller
/// knows which), and an error when it is intact but of another kind of file or another format.
pub(super) fn check_header(kind: FileKind, path: &Path, bytes: &[u8]) -> Result<bool, LogError> {
    let Some(h) = bytes.get(..HEADER_LEN) else {
        return Ok(false);
    };
    if crc32c::crc32c(&h[..12]).to_le_bytes() != h[12..] {
        return Ok(false);
    }
    if &h[..8] != kind.magic() {
        return Err(LogError::Corrupt {
            path: path.to_path_buf(),
            offset: 0,
            detail: format!("the file is not an escher raft log {}", kind.name()),
        });
    }
    let version = u32::from_le_bytes(h[8..12].try_into().expect("4 bytes"));
    if version != FORMAT_VERSION {
        return Err(LogError::UnsupportedFormat {
            path: path.to_path_buf(),
            found: version,
            supported: FORMAT_VERSION,
        });
    }
    Ok(true)
}

/// What a record holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum RecordKind {
    /// Entries to append, truncating from the first one's index.
    Entries = 1,
    /// A new hard state.
    HardState = 2,
    /// A new conf state.
    ConfState = 3,
    /// A snapshot file's contents.
    Snapshot = 4,
    /// The end of one write that `sync` made durable (empty payload).
    Sync = 5,
}

impl RecordKind {
    fn from_byte(b: u8) -> Option<Self> {
        match b {
            1 => Some(RecordKind::Entries),
            2 => Some(RecordKind::HardState),
            3 => Some(RecordKind::ConfState),
            4 => Some(RecordKind::Snapshot),
            5 => Some(RecordKind::Sync),
            _ => None,
        }
    }
}

/// Appends one record of `kind` to `buf`, its payload written by `payload`. On error `buf` is
/// left as it was.
fn push_record(
    buf: &mut Vec<u8>,
    kind: RecordKind,
    payload: impl FnOnce(&mut Vec<u8>) -> protobuf::ProtobufResult<()>,
) -> Result<(), LogError> {
    let start = buf.len();
    buf.extend_from_slice(&[0u8; RECORD_HEADER_LEN]);
    buf[start + 8] = kind as u8;
    if let Err(e) = payload(buf) {
        buf.truncate(start);
        return Err(LogError::Encode {
            detail: e.to_string(),
        });
    }
    let len = buf.len() - start - RECORD_HEADER_LEN;
    let Ok(len32) = u32::try_from(len) else {
        buf.truncate(start);
        return Err(LogError::TooLarge { bytes: len });
    };
    buf[start..start + 4].copy_from_slice(&len32.to_le_bytes());
    let mut crc = crc32c::crc32c(&buf[start..start + 4]);
    crc = crc32c::crc32c_append(crc, &buf[start + 8..]);
    buf[start + 4..start + 8].copy_from_slice(&crc.to_le_bytes());
    Ok(())
}

fn push_message(buf: &mut Vec<u8>, m: &impl Message) -> protobuf::ProtobufResult<()> {
    buf.extend_from_slice(&m.compute_size().to_le_bytes());
    m.write_to_vec(buf)
}

/// Appends an entries record.
pub(super) fn push_entries(buf: &mut Vec<u8>, ents: &[Entry]) -> Result<(), LogError> {
    push_record(buf, RecordKind::Entries, |buf| {
        buf.extend_from_slice(&(ents.len() as u32).to_le_bytes());
        ents.iter().try_for_each(|e| push_message(buf, e))
    })
}

/// Appends a hard state record.
pub(super) fn push_hard_state(buf: &mut Vec<u8>, hs: &HardState) -> Result<(), LogError> {
    push_record(buf, RecordKind::HardState, |buf| hs.write_to_vec(buf))
}

/// Appends a conf state record.
pub(super) fn push_conf_state(buf: &mut Vec<u8>, cs: &ConfState) -> Result<(), LogError> {
    push_record(buf, RecordKind::ConfState, |buf| cs.write_to_vec(buf))
}

/// Appends the marker that ends every write `sync` makes durable.
pub(super) fn push_sync(buf: &mut Vec<u8>) -> Result<(), LogError> {
    push_record(buf, RecordKind::Sync, |_| Ok(()))
}

/// The first write of a new segment: the hard and conf states the log has at that point, so that
/// a segment never depends on the ones before it for them.
pub(super) fn checkpoint(hs: &HardState, cs: &ConfState) -> Result<Vec<u8>, LogError> {
    let mut buf = Vec::new();
    push_hard_state(&mut buf, hs)?;
    push_conf_state(&mut buf, cs)?;
    push_sync(&mut buf)?;
    Ok(buf)
}

/// What a snapshot file holds: the snapshot, the hard and conf states of the log when it was
/// stored, and the first segment the log continues in.
#[derive(Debug, Clone, Default, PartialEq)]
pub(super) struct SnapshotRecord {
    pub(super) first_segment: u64,
    pub(super) hard_state: HardState,
    pub(super) conf_state: ConfState,
    pub(super) snapshot: Snapshot,
}

/// Appends a snapshot record.
pub(super) fn push_snapshot(buf: &mut Vec<u8>, s: &SnapshotRecord) -> Result<(), LogError> {
    push_record(buf, RecordKind::Snapshot, |buf| {
        buf.extend_from_slice(&s.first_segment.to_le_bytes());
        push_message(buf, &s.hard_state)?;
        push_message(buf, &s.conf_state)?;
        s.snapshot.write_to_vec(buf)
    })
}

/// One record read back.
#[derive(Debug)]
pub(super) struct Record<'a> {
    pub(super) kind: RecordKind,
    pub(super) payload: &'a [u8],
    /// The offset just past it.
    pub(super) end: usize,
}

/// Why no record could be read at an offset.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum BadRecord {
    /// The bytes end before the record does: a write that did not finish.
    Incomplete,
    /// The checksum does not match.
    Checksum,
    /// The checksum matches but the kind is unknown.
    UnknownKind(u8),
}

impl BadRecord {
    pub(super) fn describe(self) -> String {
        match self {
            BadRecord::Incomplete => "a record that runs past the end of the file".into(),
            BadRecord::Checksum => "a record whose checksum does not match".into(),
            BadRecord::UnknownKind(k) => format!("a record of unknown kind {k}"),
        }
    }
}

/// Reads the record at `at`; `Ok(None)` at the end of `bytes`.
pub(super) fn read_record(bytes: &[u8], at: usize) -> Result<Option<Record<'_>>, BadRecord> {
    let rest = &bytes[at..];
    if rest.is_empty() {
        return Ok(None);
    }
    if rest.len() < RECORD_HEADER_LEN {
        return Err(BadRecord::Incomplete);
    }
    let len = u32::from_le_bytes(rest[..4].try_into().expect("4 bytes")) as usize;
    let stored = u32::from_le_bytes(rest[4..8].try_into().expect("4 bytes"));
    let end = RECORD_HEADER_LEN + len;
    if rest.len() < end {
        return Err(BadRecord::Incomplete);
    }
    let crc = crc32c::crc32c_append(crc32c::crc32c(&rest[..4]), &rest[8..end]);
    if crc != stored {
        return Err(BadRecord::Checksum);
    }
    let kind = RecordKind::from_byte(rest[8]).ok_or(BadRecord::UnknownKind(rest[8]))?;
    Ok(Some(Record {
        kind,
        payload: &rest[RECORD_HEADER_LEN..end],
        end: at + end,
    }))
}

/// The first intact record that starts at `from` or later, with its offset: what tells a torn
/// tail from damage in the middle of a file.
pub(super) fn next_intact_record(bytes: &[u8], from: usize) -> Option<(usize, Record<'_>)> {
    (from..bytes.len()).find_map(|at| match read_record(bytes, at) {
        Ok(Some(record)) => Some((at, record)),
        _ => None,
    })
}

/// A cursor over a record's payload; every read fails cleanly on short input.
struct Reader<'a> {
    bytes: &'a [u8],
}

impl<'a> Reader<'a> {
    fn take(&mut self, n: usize) -> Result<&'a [u8], String> {
        if self.bytes.len() < n {
            return Err(format!("payload ends {} bytes early", n - self.bytes.len()));
        }
        let (head, rest) = self.bytes.split_at(n);
        self.bytes = rest;
        Ok(head)
    }

    fn u32(&mut self) -> Result<u32, String> {
        Ok(u32::from_le_bytes(
            self.take(4)?.try_into().expect("4 bytes"),
        ))
    }

    fn u64(&mut self) -> Result<u64, String> {
        Ok(u64::from_le_bytes(
            self.take(8)?.try_into().expect("8 bytes"),
        ))
    }

    fn message<M: Message>(&mut self, what: &str) -> Result<M, String> {
        let len = self.u32()? as usize;
        parse(self.take(len)?, what)
    }

    fn finish(self) -> Result<(), String> {
        match self.bytes.len() {
            0 => Ok(()),
            n => Err(format!("{n} unexpected bytes after the payload")),
        }
    }
}

fn parse<M: Message>(bytes: &[u8], what: &str) -> Result<M, String> {
    M::parse_from_bytes(bytes).map_err(|e| format!("cannot decode {what}: {e}"))
}

/// Decodes an entries record.
pub(super) fn decode_entries(payload: &[u8]) -> Result<Vec<Entry>, String> {
    let mut r = Reader { bytes: payload };
    let count = r.u32()? as usize;
    let mut ents = Vec::with_capacity(count.min(payload.len() / 4));
    for _ in 0..count {
        ents.push(r.message("an entry")?);
    }
    r.finish()?;
    Ok(ents)
}

/// Decodes a hard state record.
pub(super) fn decode_hard_state(payload: &[u8]) -> Result<HardState, String> {
    parse(payload, "a hard state")
}

/// Decodes a conf state record.
pub(super) fn decode_conf_state(payload: &[u8]) -> Result<ConfState, String> {
    parse(payload, "a conf state")
}

/// Decodes a snapshot record.
pub(super) fn decode_snapshot(payload: &[u8]) -> Result<SnapshotRecord, String> {
    let mut r = Reader { bytes: payload };
    Ok(SnapshotRecord {
        first_segment: r.u64()?,
        hard_state: r.message("a hard state")?,
        conf_state: r.message("a conf state")?,
        snapshot: parse(r.bytes, "a snapshot")?,
    })
}
