//! Snapshot files: `snapshot-<index>.snap`, one header and one checksummed record holding the
//! snapshot, the log's hard and conf states when it was stored, and the first segment the log
//! continues in. Written atomically (tmp, fsync, rename, fsync directory), so unlike a segment a
//! snapshot file is never torn: any damage is `LogError::Corrupt`.

use std::fs;
use std::path::Path;

use super::LogError;
use super::files::write_atomically;
use super::format::{self, FileKind, HEADER_LEN, RecordKind, SnapshotRecord};

const PREFIX: &str = "snapshot-";
const SUFFIX: &str = ".snap";

/// The file name of the snapshot at `index`.
pub(super) fn file_name(index: u64) -> String {
    format!("{PREFIX}{index:020}{SUFFIX}")
}

/// The index of a snapshot file's name.
pub(super) fn parse_name(name: &str) -> Option<u64> {
    let digits = name.strip_prefix(PREFIX)?.strip_suffix(SUFFIX)?;
    if digits.len() != 20 || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    digits.parse().ok()
}

/// Stores `record` durably in `dir` under the name of its snapshot's index.
pub(super) fn write(dir: &Path, record: &SnapshotRecord) -> Result<(), LogError> {
    let mut bytes = format::header(FileKind::Snapshot).to_vec();
    format::push_snapshot(&mut bytes, record)?;
    write_atomically(
        dir,
        &file_name(record.snapshot.get_metadata().index),
        &bytes,
    )
}

/// Reads and verifies the snapshot file at `path`.
pub(super) fn read(path: &Path) -> Result<SnapshotRecord, LogError> {
    let bytes = fs::read(path).map_err(LogError::io("read", path))?;
    let corrupt = |offset: usize, detail: String| LogError::Corrupt {
        path: path.to_path_buf(),
        offset: offset as u64,
        detail,
    };
    if !format::check_header(FileKind::Snapshot, path, &bytes)? {
        return Err(corrupt(0, "a damaged snapshot header".into()));
    }
    let record = match format::read_record(&bytes, HEADER_LEN) {
        Ok(Some(record)) if record.kind == RecordKind::Snapshot => record,
        Ok(Some(record)) => {
            return Err(corrupt(
                HEADER_LEN,
                format!("a {:?} record where a snapshot belongs", record.kind),
            ));
        }
        Ok(None) => return Err(corrupt(HEADER_LEN, "no snapshot record".into())),
        Err(bad) => return Err(corrupt(HEADER_LEN, bad.describe())),
    };
    if record.end != bytes.len() {
        return Err(corrupt(
            record.end,
            "unexpected bytes after the snapshot record".into(),
        ));
    }
    format::decode_snapshot(record.payload).map_err(|detail| corrupt(HEADER_LEN, detail))
}
