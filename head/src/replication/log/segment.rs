//! Log segments: the files `00000000000000000001.log`, `...02.log`, ... that records are
//! appended to, and how a segment is read back at open.
//!
//! Each write to a segment is one `sync` (or the segment's creation) and ends with a `Sync`
//! marker, then one fsync. Only the last write can therefore be partly on disk after a crash, and
//! only in the newest segment: segments are fsync'd before the next one is created. Reading back,
//! a record that is cut short or fails its checksum is a *torn tail* when nothing after it shows
//! that a later write completed (no intact record follows an intact `Sync` marker); the segment is
//! cut there. Anything else, including any damage in an older segment, is `LogError::Corrupt`.

use std::fs::{File, OpenOptions};
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};

use super::LogError;
use super::files::sync_dir;
use super::format::{
    self, BadRecord, FileKind, HEADER_LEN, RecordKind, next_intact_record, read_record,
};

/// The file name of segment `seq`.
pub(super) fn file_name(seq: u64) -> String {
    format!("{seq:020}.log")
}

/// The sequence number of a segment's file name.
pub(super) fn parse_name(name: &str) -> Option<u64> {
    let digits = name.strip_suffix(".log")?;
    if digits.len() != 20 || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    digits.parse().ok()
}

/// A segment read back at open.
#[derive(Debug)]
pub(super) struct Scanned {
    /// The bytes that hold a valid header and intact records (0: not even the header).
    pub(super) valid_len: u64,
    /// The bytes of torn tail after them, to be cut.
    pub(super) torn: u64,
    /// Why the tail was cut, when it was.
    pub(super) torn_why: Option<BadRecord>,
    /// Whether the cut write had been written whole (its sync marker is intact after the
    /// damage): then it was damaged after it was written, it may have been synced and
    /// acknowledged, and what it held is lost. Otherwise the write never finished, so it was
    /// never acknowledged.
    pub(super) written_whole: bool,
}

/// Reads the segment at `path`, whose contents are `bytes`, handing every record but the `Sync`
/// markers to `visit` with its offset. `newest`: whether this is the newest segment, the only one
/// that may end in a torn write.
pub(super) fn scan(
    path: &Path,
    bytes: &[u8],
    newest: bool,
    mut visit: impl FnMut(RecordKind, &[u8]) -> Result<(), String>,
) -> Result<Scanned, LogError> {
    let corrupt = |offset: usize, detail: String| LogError::Corrupt {
        path: path.to_path_buf(),
        offset: offset as u64,
        detail,
    };
    if !format::check_header(FileKind::Segment, path, bytes)? {
        return match later_write_completed(bytes, 0) {
            None if newest => Ok(Scanned {
                valid_len: 0,
                torn: bytes.len() as u64,
                torn_why: Some(BadRecord::Incomplete),
                written_whole: sync_marker_after(bytes, 0),
            }),
            proof => Err(corrupt(0, with_proof("a damaged segment header", proof))),
        };
    }
    let mut at = HEADER_LEN;
    loop {
        match read_record(bytes, at) {
            Ok(None) => {
                return Ok(Scanned {
                    valid_len: at as u64,
                    torn: 0,
                    torn_why: None,
                    written_whole: false,
                });
            }
            Ok(Some(record)) => {
                if record.kind != RecordKind::Sync {
                    visit(record.kind, record.payload).map_err(|detail| corrupt(at, detail))?;
                }
                at = record.end;
            }
            Err(bad) => {
                return match later_write_completed(bytes, at + 1) {
                    None if newest => Ok(Scanned {
                        valid_len: at as u64,
                        torn: (bytes.len() - at) as u64,
                        torn_why: Some(bad),
                        written_whole: sync_marker_after(bytes, at + 1),
                    }),
                    proof => Err(corrupt(at, with_proof(&bad.describe(), proof))),
                };
            }
        }
    }
}

fn with_proof(what: &str, proof: Option<usize>) -> String {
    match proof {
        Some(at) => format!("{what}, followed by intact records of later writes (at byte {at})"),
        None => format!("{what} in a segment that is not the newest"),
    }
}

/// Whether an intact `Sync` marker lies after `from`: the damaged write's own, so that write was
/// written whole.
fn sync_marker_after(bytes: &[u8], from: usize) -> bool {
    let mut at = from;
    while let Some((_, record)) = format::next_intact_record(bytes, at) {
        if record.kind == RecordKind::Sync {
            return true;
        }
        at = record.end;
    }
    false
}

/// Whether the bytes from `from` on show a write that completed after the one that was damaged:
/// an intact record that follows an intact `Sync` marker. Returns that record's offset.
fn later_write_completed(bytes: &[u8], from: usize) -> Option<usize> {
    let mut at = from;
    let mut after_sync = false;
    while let Some((found, record)) = next_intact_record(bytes, at) {
        if after_sync {
            return Some(found);
        }
        after_sync = record.kind == RecordKind::Sync;
        at = record.end;
    }
    None
}

/// The segment records are appended to.
#[derive(Debug)]
pub(super) struct ActiveSegment {
    file: File,
    path: PathBuf,
    seq: u64,
    len: u64,
}

impl ActiveSegment {
    /// Creates segment `seq` in `dir` holding a header and `first_write`, durably (file and
    /// directory entry).
    pub(super) fn create(dir: &Path, seq: u64, first_write: &[u8]) -> Result<Self, LogError> {
        let path = dir.join(file_name(seq));
        let file = OpenOptions::new()
            .write(true)
            .create_new(true)
            .open(&path)
            .map_err(LogError::io("create", &path))?;
        let mut bytes = Vec::with_capacity(HEADER_LEN + first_write.len());
        bytes.extend_from_slice(&format::header(FileKind::Segment));
        bytes.extend_from_slice(first_write);
        let mut segment = ActiveSegment {
            file,
            path,
            seq,
            len: 0,
        };
        segment.write(&bytes)?;
        sync_dir(dir)?;
        Ok(segment)
    }

    /// Opens segment `seq` in `dir` to append after its first `valid_len` bytes, cutting (and
    /// making durable the cut of) anything after them.
    pub(super) fn reopen(dir: &Path, seq: u64, valid_len: u64) -> Result<Self, LogError> {
        let path = dir.join(file_name(seq));
        let file = OpenOptions::new()
            .write(true)
            .open(&path)
            .map_err(LogError::io("open", &path))?;
        let len = file.metadata().map_err(LogError::io("stat", &path))?.len();
        if len > valid_len {
            file.set_len(valid_len)
                .map_err(LogError::io("truncate", &path))?;
            file.sync_all().map_err(LogError::io("fsync", &path))?;
        }
        Ok(ActiveSegment {
            file,
            path,
            seq,
            len: valid_len,
        })
    }

    /// Writes `bytes` at the end and fsyncs them.
    pub(super) fn write(&mut self, bytes: &[u8]) -> Result<(), LogError> {
        self.file
            .write_all_at(bytes, self.len)
            .map_err(LogError::io("write", &self.path))?;
        self.file
            .sync_data()
            .map_err(LogError::io("fsync", &self.path))?;
        self.len += bytes.len() as u64;
        Ok(())
    }

    /// Cuts the file back to the bytes written whole (after a write that failed part way).
    pub(super) fn truncate_to_len(&mut self) -> Result<(), LogError> {
        self.file
            .set_len(self.len)
            .map_err(LogError::io("truncate", &self.path))
    }

    pub(super) fn seq(&self) -> u64 {
        self.seq
    }

    pub(super) fn len(&self) -> u64 {
        self.len
    }
}
