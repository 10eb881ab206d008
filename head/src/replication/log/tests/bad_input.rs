//! Directories that are not this log's, and writes that break raft's rules: each is refused with
//! a message that says what is wrong and what to do, and changes nothing.

use std::fs;

use raft::Storage;

use super::super::format::{self, FileKind};
use super::super::{DiskLog, LogError, LogIdentity, LogStore, segment};
use super::{entry, identity, open_small};

fn open(dir: &std::path::Path, group: &str, replica: u64) -> Result<DiskLog, LogError> {
    DiskLog::open(
        dir,
        &LogIdentity {
            group: group.into(),
            replica,
        },
    )
}

#[test]
fn a_directory_of_another_group_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    drop(open(dir.path(), "blue", 1).unwrap());
    let err = open(dir.path(), "green", 1).unwrap_err();
    assert!(matches!(err, LogError::WrongGroup { .. }), "{err:?}");
    let msg = err.to_string();
    assert!(
        msg.contains("\"blue\"") && msg.contains("\"green\"") && msg.contains("--data-dir"),
        "{msg}"
    );
}

#[test]
fn a_directory_of_another_replica_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    drop(open(dir.path(), "blue", 2).unwrap());
    let err = open(dir.path(), "blue", 3).unwrap_err();
    assert!(
        matches!(
            err,
            LogError::WrongReplica {
                found: 2,
                expected: 3,
                ..
            }
        ),
        "{err:?}"
    );
    assert!(err.to_string().contains("--id 2"), "{err}");
    // The right identity still opens it.
    open(dir.path(), "blue", 2).unwrap();
}

#[test]
fn a_path_that_is_a_file_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("data");
    fs::write(&file, b"not a log").unwrap();
    let err = open(&file, "blue", 1).unwrap_err();
    assert!(matches!(err, LogError::NotADirectory { .. }), "{err:?}");
    assert!(err.to_string().contains("not a directory"), "{err}");
    assert_eq!(
        fs::read(&file).unwrap(),
        b"not a log",
        "the file is left alone"
    );

    // Below a file: the OS error, the path, and a hint.
    let err = open(&file.join("log"), "blue", 1).unwrap_err();
    assert!(matches!(err, LogError::Io { .. }), "{err:?}");
    assert!(err.to_string().contains("is a file"), "{err}");
}

#[test]
fn an_unreadable_identity_names_the_file() {
    // Permission bits do not stop root, which the test may run as; a directory where the
    // identity file belongs fails to read for everyone.
    let dir = tempfile::tempdir().unwrap();
    fs::create_dir(dir.path().join("IDENTITY")).unwrap();
    let err = open(dir.path(), "blue", 1).unwrap_err();
    assert!(
        matches!(err, LogError::Io { action: "read", .. }),
        "{err:?}"
    );
    assert!(err.to_string().contains("IDENTITY"), "{err}");
}

#[test]
fn a_directory_open_elsewhere_is_refused_until_it_is_closed() {
    let dir = tempfile::tempdir().unwrap();
    let first = open(dir.path(), "blue", 1).unwrap();
    let second = first.clone();
    drop(first);
    let err = open(dir.path(), "blue", 1).unwrap_err();
    assert!(
        matches!(err, LogError::Locked { .. }),
        "a clone keeps it open: {err:?}"
    );
    assert!(err.to_string().contains("another process"), "{err}");
    drop(second);
    open(dir.path(), "blue", 1).unwrap();
}

#[test]
fn a_format_version_we_do_not_know_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    drop(open(dir.path(), "blue", 1).unwrap());
    let id = dir.path().join("IDENTITY");
    let text = fs::read_to_string(&id).unwrap();
    fs::write(&id, text.replace("format = 1", "format = 7")).unwrap();
    let err = open(dir.path(), "blue", 1).unwrap_err();
    assert!(
        matches!(
            err,
            LogError::UnsupportedFormat {
                found: 7,
                supported: 1,
                ..
            }
        ),
        "{err:?}"
    );
    fs::write(&id, text).unwrap();

    // A segment header from a future format, with a valid checksum.
    let seg = dir.path().join(segment::file_name(1));
    let mut bytes = fs::read(&seg).unwrap();
    let mut header = format::header(FileKind::Segment);
    header[8..12].copy_from_slice(&2u32.to_le_bytes());
    let crc = crc32c::crc32c(&header[..12]);
    header[12..].copy_from_slice(&crc.to_le_bytes());
    bytes[..16].copy_from_slice(&header);
    fs::write(&seg, bytes).unwrap();
    let err = open(dir.path(), "blue", 1).unwrap_err();
    assert!(
        matches!(err, LogError::UnsupportedFormat { found: 2, .. }),
        "{err:?}"
    );
    assert!(err.to_string().contains("escher-head release"), "{err}");
}

#[test]
fn an_identity_that_cannot_be_recorded_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    for (group, replica) in [("", 1), ("two\nlines", 1), (" padded", 1), ("blue", 0)] {
        let err = open(dir.path(), group, replica).unwrap_err();
        assert!(
            matches!(err, LogError::InvalidIdentity { .. }),
            "{group:?}/{replica}: {err:?}"
        );
    }
    assert!(
        !dir.path().join("IDENTITY").exists(),
        "nothing was recorded"
    );
}

#[test]
fn log_files_without_an_identity_or_with_a_missing_segment_are_inconsistent() {
    let dir = tempfile::tempdir().unwrap();
    {
        let log = open_small(dir.path(), 64);
        for i in 1..=6 {
            log.append(&[entry(i, 1)]).unwrap();
            log.sync().unwrap();
        }
    }
    fs::remove_file(dir.path().join(segment::file_name(2))).unwrap();
    let err = DiskLog::open(dir.path(), &identity()).unwrap_err();
    assert!(matches!(err, LogError::Inconsistent { .. }), "{err:?}");
    assert!(
        err.to_string()
            .contains("00000000000000000002.log is missing"),
        "{err}"
    );

    fs::remove_file(dir.path().join("IDENTITY")).unwrap();
    let err = DiskLog::open(dir.path(), &identity()).unwrap_err();
    assert!(err.to_string().contains("no IDENTITY"), "{err}");
}

#[test]
fn a_refused_write_changes_nothing_on_disk() {
    let dir = tempfile::tempdir().unwrap();
    let log = open_small(dir.path(), 1 << 20);
    log.append(&[entry(1, 1), entry(2, 1)]).unwrap();
    for bad in [vec![entry(4, 1)], vec![entry(3, 1), entry(5, 1)]] {
        assert!(log.append(&bad).is_err());
    }
    log.sync().unwrap();
    drop(log);
    let log = open_small(dir.path(), 1 << 20);
    assert_eq!((log.first_index(), log.last_index()), (Ok(1), Ok(2)));
}

#[test]
fn errors_map_to_the_storage_errors_raft_understands() {
    use raft::StorageError;
    let compacted = LogError::Compacted {
        index: 1,
        first_index: 2,
    };
    assert_eq!(
        raft::Error::from(compacted),
        raft::Error::Store(StorageError::Compacted)
    );
    let unavailable = LogError::Unavailable {
        index: 9,
        last_index: 2,
    };
    assert_eq!(
        raft::Error::from(unavailable),
        raft::Error::Store(StorageError::Unavailable)
    );
    let gap = raft::Error::from(LogError::Gap {
        index: 9,
        last_index: 2,
    });
    assert!(
        matches!(gap, raft::Error::Store(StorageError::Other(_))),
        "{gap:?}"
    );
}

#[test]
fn after_a_failed_write_the_log_takes_no_more_writes() {
    // The directory vanishes under an open log: the next segment cannot be created.
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("log");
    let log = open_small(&path, 64);
    log.append(&[entry(1, 1)]).unwrap();
    fs::remove_dir_all(&path).unwrap();
    let err = log.sync().unwrap_err();
    assert!(
        matches!(
            err,
            LogError::Io {
                action: "create",
                ..
            }
        ),
        "{err:?}"
    );
    let err = log.append(&[entry(2, 1)]).unwrap_err();
    assert!(matches!(err, LogError::Failed { .. }), "{err:?}");
    assert!(err.to_string().contains("restart the head"), "{err}");
    assert!(matches!(log.sync(), Err(LogError::Failed { .. })));
    // Reads still answer from memory.
    assert_eq!(log.last_index(), Ok(1));
}
