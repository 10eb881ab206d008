//! Bytes damaged on purpose, and what open makes of them: a torn or flipped last write of the
//! newest segment is cut and never replayed; damage before it is `LogError::Corrupt` naming the
//! file and the offset.

use std::fs::{self, OpenOptions};
use std::path::{Path, PathBuf};

use raft::{GetEntriesContext, Storage};

use super::super::format::{HEADER_LEN, RecordKind, read_record};
use super::super::{LogError, LogStore, segment, snapshot_file};
use super::{conf, entry_with_data, open_small};

/// Segments large enough that the ten entries stay in one.
const ONE_SEGMENT: u64 = 1 << 20;

/// A log in `dir` with entries 1..=10, each appended and synced alone.
fn ten_writes(dir: &Path, segment_bytes: u64) {
    let log = open_small(dir, segment_bytes);
    for i in 1..=10 {
        log.append(&[entry_with_data(i, 1)]).unwrap();
        log.sync().unwrap();
    }
}

fn segment_path(dir: &Path, seq: u64) -> PathBuf {
    dir.join(segment::file_name(seq))
}

/// The offsets of the entries records in a segment, in order.
fn entry_records(path: &Path) -> Vec<usize> {
    let bytes = fs::read(path).unwrap();
    let mut at = HEADER_LEN;
    let mut found = Vec::new();
    while let Ok(Some(record)) = read_record(&bytes, at) {
        if record.kind == RecordKind::Entries {
            found.push(at);
        }
        at = record.end;
    }
    found
}

fn flip(path: &Path, offset: usize) {
    let mut bytes = fs::read(path).unwrap();
    bytes[offset] ^= 0x40;
    fs::write(path, bytes).unwrap();
}

fn cut(path: &Path, len: u64) {
    OpenOptions::new()
        .write(true)
        .open(path)
        .unwrap()
        .set_len(len)
        .unwrap();
}

fn last_index(dir: &Path) -> u64 {
    open_small(dir, ONE_SEGMENT).last_index().unwrap()
}

fn corrupt_at(dir: &Path) -> (PathBuf, u64, String) {
    match super::super::DiskLog::open(dir, &super::identity()) {
        Err(LogError::Corrupt {
            path,
            offset,
            detail,
        }) => (path, offset, detail),
        other => panic!("expected Corrupt, got {other:?}"),
    }
}

#[test]
fn a_file_cut_mid_record_loses_only_that_write_and_it_is_never_replayed() {
    let dir = tempfile::tempdir().unwrap();
    ten_writes(dir.path(), ONE_SEGMENT);
    let path = segment_path(dir.path(), 1);
    let last_write = *entry_records(&path).last().unwrap() as u64;
    let len = fs::metadata(&path).unwrap().len();
    cut(&path, len - 12);

    let log = open_small(dir.path(), ONE_SEGMENT);
    assert_eq!(log.last_index(), Ok(9));
    assert_eq!(
        fs::metadata(&path).unwrap().len(),
        last_write,
        "the torn write is cut off"
    );
    // Its sync marker is gone: the head stopped while writing it, or the file was cut after
    // it was synced. The log cannot tell which, so it reports the write as lost.
    let lost = log.lost_tail().expect("a lost tail");
    assert_eq!((lost.offset, lost.written_whole), (last_write, false));

    // A different entry 10 takes its place, and survives another reopen.
    log.append(&[entry_with_data(10, 2)]).unwrap();
    log.sync().unwrap();
    drop(log);
    let log = open_small(dir.path(), ONE_SEGMENT);
    let ents = log
        .entries(9, 11, None, GetEntriesContext::empty(false))
        .unwrap();
    assert_eq!(ents, vec![entry_with_data(9, 1), entry_with_data(10, 2)]);
}

/// The newest segment cut 10 bytes short, as a file that lost its end after it was synced
/// would be: the last write, which may have been synced and acknowledged before the cut, is
/// lost, and the log does not claim it was never acknowledged; the ids a lone head skips for it
/// cover the whole write and more, since a cut may take later writes too.
#[test]
fn a_tail_cut_10_bytes_short_is_reported_lost_with_the_ids_it_may_have_held() {
    let dir = tempfile::tempdir().unwrap();
    ten_writes(dir.path(), ONE_SEGMENT);
    let path = segment_path(dir.path(), 1);
    let last_write = *entry_records(&path).last().unwrap() as u64;
    let len = fs::metadata(&path).unwrap().len();
    cut(&path, len - 10);

    let log = open_small(dir.path(), ONE_SEGMENT);
    assert_eq!(log.last_index(), Ok(9), "entry 10 is gone");
    let lost = log.lost_tail().expect("the cut write is reported lost");
    assert_eq!(lost.path, path);
    assert_eq!(lost.offset, last_write);
    assert_eq!(lost.bytes, len - 10 - last_write);
    assert!(!lost.written_whole);
    let whole_write = len - last_write;
    assert_eq!(lost.ids_at_risk(), lost.bytes + super::super::CUT_TAIL_IDS);
    assert!(
        lost.ids_at_risk() > whole_write,
        "{} ids skipped for a write of {whole_write} bytes",
        lost.ids_at_risk()
    );
    let said = lost.describe();
    assert!(said.contains("cannot tell"), "{said}");
    assert!(said.contains("may have been acknowledged"), "{said}");
    drop(log);
    assert_eq!(
        open_small(dir.path(), ONE_SEGMENT).lost_tail(),
        None,
        "once"
    );
}

#[test]
fn a_flipped_byte_in_the_last_record_is_cut_not_replayed() {
    let dir = tempfile::tempdir().unwrap();
    ten_writes(dir.path(), ONE_SEGMENT);
    let path = segment_path(dir.path(), 1);
    let last_write = *entry_records(&path).last().unwrap();
    let len = fs::metadata(&path).unwrap().len();
    flip(&path, last_write + 20);
    let log = open_small(dir.path(), ONE_SEGMENT);
    assert_eq!(log.last_index(), Ok(9));
    assert_eq!(fs::metadata(&path).unwrap().len(), last_write as u64);
    // Its sync marker is intact: it was written whole, may have been acknowledged, and the
    // log says it lost it (a lone head then skips the ids it may have given out).
    let lost = log.lost_tail().expect("a lost tail");
    assert_eq!(lost.path, path);
    assert_eq!(lost.offset, last_write as u64);
    assert_eq!(lost.bytes, len - last_write as u64);
    drop(log);
    // Reopened, the log is whole again: nothing more is lost.
    assert_eq!(open_small(dir.path(), ONE_SEGMENT).lost_tail(), None);
}

#[test]
fn a_flipped_byte_in_the_last_sync_marker_drops_only_the_marker() {
    let dir = tempfile::tempdir().unwrap();
    ten_writes(dir.path(), ONE_SEGMENT);
    let path = segment_path(dir.path(), 1);
    let len = fs::metadata(&path).unwrap().len();
    flip(&path, len as usize - 1);
    // The entries record before the marker is intact: it was written, so it is kept.
    assert_eq!(last_index(dir.path()), 10);
}

#[test]
fn a_flipped_byte_before_the_last_write_is_corrupt() {
    let dir = tempfile::tempdir().unwrap();
    ten_writes(dir.path(), ONE_SEGMENT);
    let path = segment_path(dir.path(), 1);
    let fifth = entry_records(&path)[4];
    flip(&path, fifth + 20);
    let (at, offset, detail) = corrupt_at(dir.path());
    assert_eq!((at, offset), (path, fifth as u64));
    assert!(detail.contains("checksum"), "{detail}");
    assert!(detail.contains("later writes"), "{detail}");
}

#[test]
fn a_damaged_length_before_the_last_write_is_corrupt() {
    // A length that runs past the end of the file looks like a torn write, but intact later
    // writes follow it.
    let dir = tempfile::tempdir().unwrap();
    ten_writes(dir.path(), ONE_SEGMENT);
    let path = segment_path(dir.path(), 1);
    let fifth = entry_records(&path)[4];
    let mut bytes = fs::read(&path).unwrap();
    bytes[fifth + 3] = 0x7f;
    fs::write(&path, bytes).unwrap();
    let (at, offset, _) = corrupt_at(dir.path());
    assert_eq!((at, offset), (path, fifth as u64));
}

#[test]
fn damage_at_the_end_of_an_older_segment_is_corrupt() {
    let dir = tempfile::tempdir().unwrap();
    // 200-byte segments: every write after the first starts a new one.
    ten_writes(dir.path(), 200);
    let path = segment_path(dir.path(), 2);
    let last = *entry_records(&path).last().unwrap();
    flip(&path, last + 20);
    let (at, offset, detail) = corrupt_at(dir.path());
    assert_eq!((at, offset), (path, last as u64));
    assert!(detail.contains("not the newest"), "{detail}");
}

#[test]
fn a_segment_torn_while_being_created_is_removed() {
    let dir = tempfile::tempdir().unwrap();
    ten_writes(dir.path(), ONE_SEGMENT);
    let torn = segment_path(dir.path(), 2);
    fs::write(&torn, b"ESCHRL").unwrap();
    let log = open_small(dir.path(), ONE_SEGMENT);
    assert_eq!(log.last_index(), Ok(10));
    assert!(!torn.exists());
    log.append(&[entry_with_data(11, 1)]).unwrap();
    log.sync().unwrap();
    drop(log);
    assert_eq!(last_index(dir.path()), 11);
}

#[test]
fn a_damaged_snapshot_file_is_corrupt() {
    let dir = tempfile::tempdir().unwrap();
    ten_writes(dir.path(), ONE_SEGMENT);
    let log = open_small(dir.path(), ONE_SEGMENT);
    log.compact(5, conf(&[1]), b"state machine".to_vec())
        .unwrap();
    drop(log);
    let path = dir.path().join(snapshot_file::file_name(5));
    let len = fs::metadata(&path).unwrap().len() as usize;
    flip(&path, len - 3);
    let (at, offset, _) = corrupt_at(dir.path());
    assert_eq!((at, offset), (path, HEADER_LEN as u64));
}
